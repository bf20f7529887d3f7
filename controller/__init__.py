"""The cluster's metadata: its records (``records``) and the image they build (``image``).

Controllers and brokers share this code: both replay the committed metadata log into a
``MetadataImage`` through a ``MetadataDelta``, load and write snapshots of it, and compare
digests to prove they agree. The active controller's decisions (placement, elections,
fencing) build on it and live elsewhere.
"""

from controller.image import (
    NO_LEADER,
    BrokerRegistration,
    Endpoint,
    ImageError,
    MetadataDelta,
    MetadataImage,
    PartitionState,
    TopicImage,
    decode_snapshot,
    encode_snapshot,
    image_from_records,
)
from controller.records import (
    ConfigResourceType,
    MetadataRecord,
    RecordError,
    SnapshotError,
    decode,
    encode,
)

__all__ = [
    "NO_LEADER",
    "BrokerRegistration",
    "ConfigResourceType",
    "Endpoint",
    "ImageError",
    "MetadataDelta",
    "MetadataImage",
    "MetadataRecord",
    "PartitionState",
    "RecordError",
    "SnapshotError",
    "TopicImage",
    "decode",
    "decode_snapshot",
    "encode",
    "encode_snapshot",
    "image_from_records",
]
