"""Wire schemas and their generated Python code.

``raft.proto`` is the source of truth; ``raft_pb2.py``, ``raft_pb2.pyi`` and
``raft_pb2_grpc.py`` are generated from it by ``python -m proto.generate`` and committed
(``python -m proto.generate --check`` proves they match). Code outside this package should
not use the generated classes directly: ``raft/wire.py`` converts them to and from
``raft.messages``.
"""
