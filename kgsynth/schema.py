"""Every record kgsynth writes, and its Parquet schema.

Ids chain provenance: ``walk_id`` -> ``question_id`` -> ``trajectory_id``.
"""

from __future__ import annotations

import pyarrow as pa

HOP = pa.struct([("relation", pa.string()), ("inverse", pa.bool_()), ("entity", pa.string())])

WALK_SCHEMA = pa.schema(
    [
        ("walk_id", pa.string()),
        ("structure", pa.string()),
        ("hops", pa.int32()),
        ("topic_names", pa.list_(pa.string())),
        ("topic_ids", pa.list_(pa.string())),
        # One inner list per path from a topic entity; ``entity`` is the name reached by the
        # hop on the sampled path. ``merge_at[i]`` is how many hops of branch i lead to the
        # node where the branches meet (hops after it, IP's last hop, follow the meeting).
        ("branches", pa.list_(pa.list_(HOP))),
        ("merge_at", pa.list_(pa.int32())),
        ("answer_names", pa.list_(pa.string())),
        ("answer_ids", pa.list_(pa.string())),
        ("sampled_answer", pa.string()),
        ("sparql", pa.string()),
        ("seed", pa.int64()),
        ("attempt", pa.int64()),
    ]
)
