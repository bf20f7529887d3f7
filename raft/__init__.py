"""The Raft metadata quorum: a sans-I/O KRaft-style core (``core``), its messages, and (in
later steps) the asyncio driver and gRPC transport."""
