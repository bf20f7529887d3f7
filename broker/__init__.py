"""The broker node: its life in the cluster (``lifecycle``), the Kafka protocol codec
(``protocol``), the client listener (``server``), the API handlers (``handlers``,
``dispatcher``), its partitions (``replica_manager``) and the whole data plane
(``runtime``). Import the modules themselves: this package imports nothing, so the pure codec
loads without asyncio or gRPC."""
