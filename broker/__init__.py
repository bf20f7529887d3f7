"""The broker node: for now its life in the cluster (``lifecycle``); the Kafka protocol
listener, replication and groups come with later issues."""

from broker.lifecycle import BrokerLifecycle, BrokerState, PartitionAssignment

__all__ = ["BrokerLifecycle", "BrokerState", "PartitionAssignment"]
