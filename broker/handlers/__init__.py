"""The Kafka API handlers, by API key (see ``common.py`` for their shape)."""

from __future__ import annotations

from collections.abc import Mapping

from broker.handlers import admin, configs, fetch, groups, metadata, offsets, produce, records
from broker.handlers.common import Handler
from broker.protocol import ApiKey

__all__ = ["HANDLERS"]

HANDLERS: Mapping[int, Handler] = {
    ApiKey.PRODUCE: produce.produce,
    ApiKey.FETCH: fetch.fetch,
    ApiKey.LIST_OFFSETS: offsets.list_offsets,
    ApiKey.METADATA: metadata.metadata,
    ApiKey.INIT_PRODUCER_ID: produce.init_producer_id,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: offsets.offset_for_leader_epoch,
    ApiKey.API_VERSIONS: metadata.api_versions,
    ApiKey.CREATE_TOPICS: admin.create_topics,
    ApiKey.DELETE_TOPICS: admin.delete_topics,
    ApiKey.DELETE_RECORDS: records.delete_records,
    ApiKey.DESCRIBE_CONFIGS: configs.describe_configs,
    ApiKey.ALTER_CONFIGS: configs.alter_configs,
    ApiKey.CREATE_PARTITIONS: admin.create_partitions,
    ApiKey.ELECT_LEADERS: admin.elect_leaders,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: configs.incremental_alter_configs,
    ApiKey.DESCRIBE_CLUSTER: metadata.describe_cluster,
    ApiKey.FIND_COORDINATOR: groups.find_coordinator,
}
