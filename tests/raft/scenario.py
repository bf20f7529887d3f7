"""Scenario files for the Raft core: short stories with the expected trace under each command.

How it works. In the spirit of etcd-io/raft's ``testdata/*.txt`` (driven by datadriven), a
file is a list of commands, each followed by a ``----`` line and the output it must produce;
a blank line ends the output. Lines starting with ``#`` and blank lines between commands are
the story and are kept as they are::

    # Node 1's election timer fires first.
    tick 1
    ----
    tick 1 at 1431
      1: unattached -> prospective (epoch 0)
      1->2 PreVote epoch=1 last_epoch=-1 end=0

Commands (voters are nodes 1..n, observers follow):

    cluster voters=3 [observers=0] [seed=1] [<RaftConfig field>=<int> ...]
    tick <node>                   move time to the node's next deadline and fire it (as in
                                  advance, earlier deadlines fire first and messages wait)
    advance <ms>                  move time, firing every live node's deadlines in order;
                                  messages stay in flight
    run <ms>                      like advance, but every message is delivered when sent
    deliver [from=N] [to=N] [type=Kind] [drop]
                                  deliver (or drop) the in-flight messages that match, in
                                  order; the replies they cause stay in flight
    stabilize                     deliver and fire due deadlines (time stands still) until quiet
    propose <node> <record>...    one record per word
    resign <node>                 a leader's graceful shutdown
    snapshot <node>               the state machine snapshots at the node's HW
    cut <a>-<b> | <a>-><b> ...    links drop messages at delivery (both ways / one way)
    isolate <node>                cut all of the node's links both ways
    heal [<a>-<b> | <a>-><b> ...] restore links (all of them when none is named)
    crash <node>                  stop the node: its log, quorum state and snapshots survive
    restart <node>                a new core from that durable state
    status                        per node: role, epoch, leader, vote, HW, LEO, next deadline
    log <node>                    the node's log and applied records

Any command takes ``quiet``: its trace is left out (for setting the scene; follow it with
``status``).

Output. Every call into a core prints a cause line (``tick 1 at 1431``, the message delivered,
``1 proposes a b: last offset 2``) and then its effects, indented, in ``Ready`` order: role
changes (``Ready.events``), the quorum-state write, the log write, snapshot chunks, messages
sent, the commit with the records it applies, log deletion. Batches read ``base-last@epoch``,
snapshots and divergence points ``end@epoch``; ``-`` means no leader or no vote. The network
is perfect and instant apart from the links cut; a Ready is carried out in full before the
next call, so everything written is durable when a node crashes.

A mismatch fails with a diff naming the file and line. ``RUNNEL_REWRITE_SCENARIOS=1`` rewrites
the expected blocks from the actual output (etcd's ``-rewrite``): read every block it changes.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cluster import Cluster, Node

from raft.core import LogMeta, NotLeader, RaftConfig, RaftCore, decode_records, encode_records
from raft.messages import (
    NO_LEADER,
    Batch,
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    Envelope,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Payload,
    Ready,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)

REWRITE_ENV = "RUNNEL_REWRITE_SCENARIOS"
_MAX_STEPS = 10_000  # a command that does not settle within this many calls is a bug
_NO_TIMER = 2**61
_EVENT = re.compile(r"(\w+)@(\d+)")


class ScenarioError(Exception):
    """A malformed command, or one the cluster cannot carry out."""


# -- formatting (pure) -------------------------------------------------------------------------


def _who(node_id: int) -> str:
    return "-" if node_id == NO_LEADER else str(node_id)


def fmt_batch(batch: Batch) -> str:
    return f"{batch.base_offset}-{batch.last_offset}@{batch.epoch}"


def fmt_snapshot(snapshot: SnapshotId) -> str:
    return f"{snapshot.end_offset}@{snapshot.epoch}"


def fmt_records(records: Sequence[bytes]) -> str:
    return " ".join(r.decode(errors="replace") or '""' for r in records)


def fmt_contents(batch: Batch) -> str:
    return "leader-change" if batch.is_control else fmt_records(decode_records(batch.data))


def _fmt_vote(p: VoteRequest | VoteResponse) -> str:
    kind = "PreVote" if p.pre_vote else "Vote"
    if isinstance(p, VoteRequest):
        return f"{kind} epoch={p.epoch} last_epoch={p.last_epoch} end={p.last_epoch_end_offset}"
    verdict = "granted" if p.granted else "rejected"
    leader = f" leader={p.leader_id}" if p.leader_id != NO_LEADER else ""
    return f"{kind}Response epoch={p.epoch} {verdict}{leader}"


def _fmt_fetch_response(p: FetchResponse) -> str:
    text = f"FetchResponse epoch={p.epoch} leader={_who(p.leader_id)} hw={p.high_watermark}"
    if p.log_start_offset:
        text += f" start={p.log_start_offset}"
    if p.batches:
        text += " batches=" + ",".join(fmt_batch(b) for b in p.batches)
    if p.diverging is not None:
        text += f" diverging={p.diverging.end_offset}@{p.diverging.epoch}"
    if p.snapshot_id is not None:
        text += f" snapshot={fmt_snapshot(p.snapshot_id)}"
    return text


def _fmt_snapshot_response(p: FetchSnapshotResponse) -> str:
    head = f"FetchSnapshotResponse epoch={p.epoch} snapshot={fmt_snapshot(p.snapshot_id)}"
    if p.missing:
        return f"{head} missing"
    return f"{head} pos={p.position} size={p.size} chunk={len(p.chunk)}"


def fmt_payload(p: Payload) -> str:
    if isinstance(p, VoteRequest | VoteResponse):
        return _fmt_vote(p)
    if isinstance(p, FetchResponse):
        return _fmt_fetch_response(p)
    if isinstance(p, FetchSnapshotResponse):
        return _fmt_snapshot_response(p)
    if isinstance(p, FetchRequest):
        return (
            f"Fetch epoch={p.epoch} offset={p.fetch_offset} "
            f"last_epoch={p.last_fetched_epoch} wait={p.max_wait_ms}"
        )
    if isinstance(p, FetchSnapshotRequest):
        return (
            f"FetchSnapshot epoch={p.epoch} snapshot={fmt_snapshot(p.snapshot_id)} pos={p.position}"
        )
    if isinstance(p, BeginQuorumEpochRequest | EndQuorumEpochRequest):
        text = f"{type(p).__name__.removesuffix('Request')} epoch={p.epoch} leader={p.leader_id}"
        if isinstance(p, EndQuorumEpochRequest) and p.preferred_successors:
            text += " successors=" + ",".join(map(str, p.preferred_successors))
        return text
    return f"{type(p).__name__} epoch={p.epoch}"


def fmt_envelope(envelope: Envelope) -> str:
    return f"{envelope.source}->{envelope.destination} {fmt_payload(envelope.payload)}"


def kind_of(envelope: Envelope) -> str:
    return fmt_payload(envelope.payload).split()[0]


def fmt_transitions(node_id: int, before: str, events: Sequence[str]) -> list[str]:
    lines = []
    for event in events:
        match = _EVENT.fullmatch(event)
        if match is None:
            lines.append(f"{node_id}: {event}")
            continue
        lines.append(f"{node_id}: {before} -> {match[1]} (epoch {match[2]})")
        before = match[1]
    return lines


def fmt_storage(node_id: int, ready: Ready) -> list[str]:
    """Lines for Ready steps 1 and 2: the quorum-state write, the log write, snapshot chunks."""
    lines, state, write = [], ready.quorum_state, ready.log_write
    if state is not None:
        lines.append(
            f"{node_id}: persist epoch={state.epoch} voted={_who(state.voted_for)} "
            f"leader={_who(state.leader_id)}"
        )
    for snapshot, position, chunk in ready.snapshot_chunks:
        lines.append(
            f"{node_id}: snapshot {fmt_snapshot(snapshot)} chunk pos={position} len={len(chunk)}"
        )
    if ready.snapshot_loaded is not None:
        lines.append(f"{node_id}: snapshot {fmt_snapshot(ready.snapshot_loaded)} loaded")
    if write is not None and write.restart_at is not None:
        lines.append(f"{node_id}: log restarts at {write.restart_at}")
    if write is not None and write.truncate_to is not None:
        lines.append(f"{node_id}: truncate to {write.truncate_to}")
    for batch in write.batches if write is not None else ():
        lines.append(f"{node_id}: append {fmt_batch(batch)} {fmt_contents(batch)}")
    return lines


def fmt_commit(node_id: int, ready: Ready, applied: Sequence[bytes]) -> list[str]:
    lines = []
    if ready.commit_offset is not None:
        records = f", apply {fmt_records(applied)}" if applied else ""
        lines.append(f"{node_id}: commit to {ready.commit_offset}{records}")
    if ready.delete_before is not None:
        lines.append(f"{node_id}: delete log before {ready.delete_before}")
    return lines


def fmt_status(node_id: int, core: RaftCore, voted_for: int) -> str:
    timer = core.next_deadline_ms
    start = f" start={core.log_start_offset}" if core.log_start_offset else ""
    return (
        f"{node_id}: {core.role} epoch={core.epoch} leader={_who(core.leader_id)} "
        f"voted={_who(voted_for)} hw={core.high_watermark} leo={core.log_end_offset}{start} "
        f"timer={'-' if timer >= _NO_TIMER else timer}"
    )


# -- the harness -------------------------------------------------------------------------------


def _log_meta(log: list[Batch], snapshot: SnapshotId | None) -> LogMeta:
    """What a restarted node's log store reports: bounds and epoch boundaries."""
    epochs: list[tuple[int, int]] = []
    for batch in log:
        if not epochs or batch.epoch > epochs[-1][0]:
            epochs.append((batch.epoch, batch.base_offset))
    if log:
        return LogMeta(log[0].base_offset, log[-1].next_offset, tuple(epochs), snapshot)
    start = snapshot.end_offset if snapshot is not None else 0
    return LogMeta(start, start, (), snapshot)


def _read_log(log: list[Batch], offset: int, max_bytes: int) -> tuple[Batch, ...]:
    batches: list[Batch] = []
    size = 0
    for batch in (b for b in log if b.base_offset >= offset):
        size += len(batch.data)
        if batches and size > max_bytes:
            break
        batches.append(batch)
    return tuple(batches)


class ScenarioCluster(Cluster):
    """cluster.py's harness, driven one call at a time and traced; adds snapshots (stored
    bytes, chunked transfer), crashes and restarts from durable state."""

    def __init__(self, voters: int, observers: int, config: RaftConfig, seed: int) -> None:
        super().__init__(voters, observers, config, seed)
        self.seed = seed
        self.trace: list[str] = []
        self.down: set[int] = set()
        self.snapshots: dict[int, dict[SnapshotId, bytes]] = {n: {} for n in self.nodes}
        self.partial: dict[int, bytearray] = {n: bytearray() for n in self.nodes}
        self.roles = {n: node.core.role for n, node in self.nodes.items()}

    def node(self, node_id: int) -> Node:
        if node_id not in self.nodes:
            raise ScenarioError(f"no node {node_id}")
        if node_id in self.down:
            raise ScenarioError(f"node {node_id} is down")
        return self.nodes[node_id]

    # -- carrying out a Ready, traced ------------------------------------------------------
    def call(self, node_id: int, cause: str, fn: Callable[[RaftCore], Ready]) -> None:
        self.trace.append(cause)
        self.apply(node_id, fn(self.nodes[node_id].core))

    def apply(self, node_id: int, ready: Ready) -> None:
        node = self.nodes[node_id]
        self._receive_snapshot(node_id, ready)
        applied, queued = len(node.applied), len(self.queue)
        super().apply(node_id, ready)
        if ready.delete_before is not None:
            node.log = [b for b in node.log if b.next_offset > ready.delete_before]
        lines = fmt_transitions(node_id, self.roles[node_id], ready.events)
        lines += fmt_storage(node_id, ready)
        lines += [fmt_envelope(e) for e in self.queue[queued:]]
        lines += fmt_commit(node_id, ready, node.applied[applied:])
        self.trace.extend("  " + line for line in lines)
        self.roles[node_id] = node.core.role

    def _receive_snapshot(self, node_id: int, ready: Ready) -> None:
        node, buffer = self.nodes[node_id], self.partial[node_id]
        for _, position, chunk in ready.snapshot_chunks:
            if position == 0:
                buffer.clear()
            buffer.extend(chunk)
        loaded = ready.snapshot_loaded
        if loaded is not None:
            self.snapshots[node_id][loaded] = bytes(buffer)
            node.applied = decode_records(bytes(buffer))
            node.commit = loaded.end_offset
            buffer.clear()
        if ready.log_write is not None and ready.log_write.restart_at is not None:
            node.log = []

    def _fill(self, node: Node, envelope: Envelope) -> Envelope:
        """Lazy replies read the sender's log or snapshot, honouring the byte limits (a log
        read returns at least one batch, as Kafka's does)."""
        payload = envelope.payload
        if isinstance(payload, FetchResponse) and payload.read_from is not None:
            batches = _read_log(node.log, payload.read_from, payload.read_max_bytes)
            payload = replace(payload, batches=batches, read_from=None, read_max_bytes=0)
        elif isinstance(payload, FetchSnapshotResponse) and payload.read_position is not None:
            data = self.snapshots[envelope.source][payload.snapshot_id]
            start, end = payload.read_position, payload.read_position + payload.read_max_bytes
            payload = replace(
                payload, chunk=data[start:end], size=len(data), read_position=None, read_max_bytes=0
            )
        return Envelope(envelope.source, envelope.destination, payload)

    # -- entry points ----------------------------------------------------------------------
    def propose(self, leader: int, records: list[bytes]) -> int:
        last, ready = self.node(leader).core.propose(records, self.now)
        self.trace.append(f"{leader} proposes {fmt_records(records)}: last offset {last}")
        self.apply(leader, ready)
        return last

    def take_snapshot(self, node_id: int) -> None:
        node = self.node(node_id)
        end = node.core.high_watermark
        epochs = [b.epoch for b in node.log if b.base_offset < end <= b.next_offset]
        if not epochs:
            raise ScenarioError(f"node {node_id} has no committed record to snapshot at")
        snapshot = SnapshotId(end, epochs[0])
        self.snapshots[node_id][snapshot] = encode_records(node.applied)
        cause = f"{node_id} snapshots at {fmt_snapshot(snapshot)}"
        self.call(node_id, cause, lambda core: core.snapshot_taken(snapshot, self.now))

    def tick(self, node_id: int) -> None:
        """Fire the node's next deadline; earlier deadlines of other nodes fire first."""
        deadline = self.node(node_id).core.next_deadline_ms
        if deadline >= _NO_TIMER:
            raise ScenarioError(f"node {node_id} has no deadline")
        if deadline > self.now:
            self.advance(deadline - 1, deliver=False)
        self.now = max(self.now, deadline)
        self._tick(node_id)

    def _tick(self, node_id: int) -> None:
        self.call(node_id, f"tick {node_id} at {self.now}", lambda core: core.tick(self.now))

    def fire_due(self) -> bool:
        due = [n for n in self.live() if self.nodes[n].core.next_deadline_ms <= self.now]
        for node_id in due:
            self._tick(node_id)
        return bool(due)

    def advance(self, until_ms: int, deliver: bool) -> None:
        for _ in range(_MAX_STEPS):
            if deliver:
                self.stabilize(fire=False)
            due = min((self.nodes[n].core.next_deadline_ms for n in self.live()), default=until_ms)
            if due > until_ms:
                self.now = until_ms
                return
            self.now = max(self.now, due)
            self.fire_due()
        raise ScenarioError(f"time did not reach {until_ms} in {_MAX_STEPS} steps")

    def deliver(self, match: Callable[[Envelope], bool], drop: bool = False) -> bool:
        chosen = [e for e in self.queue if match(e)]
        self.queue = [e for e in self.queue if not match(e)]
        for envelope in chosen:
            self._deliver_one(envelope, drop)
        return bool(chosen)

    def _deliver_one(self, envelope: Envelope, drop: bool) -> None:
        line, target = fmt_envelope(envelope), envelope.destination
        if drop or (envelope.source, target) in self.cut or target in self.down:
            reason = "dropped" if drop else "cut" if target not in self.down else "down"
            self.trace.append(f"{line} ({reason})")
            return
        self.call(target, line, lambda core: core.step(envelope, self.now))

    def stabilize(self, fire: bool = True) -> None:
        for _ in range(_MAX_STEPS):
            delivered = self.deliver(lambda e: True)
            if not delivered and not (fire and self.fire_due()):
                return
        raise ScenarioError(f"not quiet after {_MAX_STEPS} rounds")

    def live(self) -> list[int]:
        return [n for n in self.nodes if n not in self.down]

    # -- crashes ---------------------------------------------------------------------------
    def crash(self, node_id: int) -> str:
        node = self.node(node_id)
        self.down.add(node_id)
        node.applied, node.commit = [], 0  # the state machine is volatile
        self.partial[node_id].clear()
        state = node.state
        return (
            f"{node_id} crashes; kept epoch={state.epoch} voted={_who(state.voted_for)} "
            f"leader={_who(state.leader_id)} log=[{self.bounds(node)})"
        )

    def bounds(self, node: Node) -> str:
        meta = _log_meta(node.log, self._latest_snapshot(node.core.node_id))
        return f"{meta.start_offset},{meta.end_offset}"

    def _latest_snapshot(self, node_id: int) -> SnapshotId | None:
        return max(self.snapshots[node_id], key=lambda s: s.end_offset, default=None)

    def restart(self, node_id: int) -> list[str]:
        if node_id not in self.down:
            raise ScenarioError(f"node {node_id} is not down")
        node, snapshot = self.nodes[node_id], self._latest_snapshot(node_id)
        node.core = RaftCore(
            self.config,
            node_id,
            self.voter_ids,
            state=node.state,
            log=_log_meta(node.log, snapshot),
            seed=self.seed,
            now_ms=self.now,
        )
        node.applied = decode_records(self.snapshots[node_id][snapshot]) if snapshot else []
        node.commit = node.core.high_watermark
        self.down.discard(node_id)
        self.roles[node_id] = node.core.role
        return [f"{node_id} restarts", "  " + fmt_status(node_id, node.core, node.state.voted_for)]


# -- commands ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Args:
    words: tuple[str, ...]
    options: dict[str, str] = field(default_factory=dict)
    quiet: bool = False

    @staticmethod
    def parse(text: Sequence[str]) -> Args:
        words = tuple(w for w in text if "=" not in w and w != "quiet")
        options = dict(w.split("=", 1) for w in text if "=" in w)
        return Args(words, options, "quiet" in text)

    def node(self, index: int = 0) -> int:
        if len(self.words) <= index:
            raise ScenarioError("a node id is missing")
        return _int(self.words[index])

    def option(self, name: str, default: int | None = None) -> int | None:
        return _int(self.options[name]) if name in self.options else default


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ScenarioError(f"not a number: {text!r}") from None


def _links(words: Sequence[str], all_nodes: Sequence[int]) -> set[tuple[int, int]]:
    """``1-2`` is both directions, ``1->2`` one; a bare id is every link of that node."""
    links: set[tuple[int, int]] = set()
    for word in words:
        if "->" in word:
            a, b = word.split("->")
            links.add((_int(a), _int(b)))
        elif "-" in word:
            a, b = word.split("-")
            links |= {(_int(a), _int(b)), (_int(b), _int(a))}
        else:
            node = _int(word)
            links |= {(node, o) for o in all_nodes} | {(o, node) for o in all_nodes}
    return links


class Interpreter:
    """Runs commands against one ScenarioCluster and returns their output lines."""

    def __init__(self) -> None:
        self._cluster: ScenarioCluster | None = None
        self._commands: dict[str, Callable[[Args], list[str] | None]] = {
            "cluster": self._create,
            "tick": lambda a: self.cluster.tick(a.node()),
            "advance": lambda a: self.cluster.advance(self.cluster.now + a.node(), False),
            "run": lambda a: self.cluster.advance(self.cluster.now + a.node(), True),
            "deliver": self._deliver,
            "stabilize": lambda a: self.cluster.stabilize(),
            "propose": self._propose,
            "resign": lambda a: self._call(a.node(), "resigns", RaftCore.resign),
            "snapshot": lambda a: self.cluster.take_snapshot(a.node()),
            "cut": lambda a: self._cut(a.words, heal=False),
            "isolate": lambda a: self._cut(a.words, heal=False),
            "heal": lambda a: self._cut(a.words, heal=True),
            "crash": lambda a: [self.cluster.crash(a.node())],
            "restart": lambda a: self.cluster.restart(a.node()),
            "status": self._status,
            "log": self._log,
        }

    @property
    def cluster(self) -> ScenarioCluster:
        if self._cluster is None:
            raise ScenarioError("no cluster yet: start with `cluster voters=N`")
        return self._cluster

    def execute(self, command: str) -> list[str]:
        name, *words = command.split()
        if name not in self._commands:
            raise ScenarioError(f"unknown command {name!r}")
        args = Args.parse(words)
        try:
            lines = self._commands[name](args)
        except (ScenarioError, NotLeader) as e:
            lines = [f"error: {e}"]
        if self._cluster is not None:
            trace = [] if args.quiet else self._cluster.trace
            lines = trace + (lines or [])
            self._cluster.trace = []
        return lines or ["ok"]

    def _create(self, args: Args) -> None:
        fields = {f.name for f in dataclasses.fields(RaftConfig)}
        unknown = set(args.options) - fields - {"voters", "observers", "seed"}
        if unknown:
            raise ScenarioError(f"unknown options {sorted(unknown)}")
        overrides = {k: _int(v) for k, v in args.options.items() if k in fields}
        voters, observers = args.option("voters", 3), args.option("observers", 0)
        self._cluster = ScenarioCluster(
            voters or 0, observers or 0, RaftConfig(**overrides), args.option("seed", 1) or 0
        )

    def _call(self, node_id: int, verb: str, fn: Callable[[RaftCore, int], Ready]) -> None:
        self.cluster.node(node_id)
        self.cluster.call(node_id, f"{node_id} {verb}", lambda core: fn(core, self.cluster.now))

    def _propose(self, args: Args) -> None:
        if len(args.words) < 2:
            raise ScenarioError("propose <node> <record>...")
        self.cluster.propose(args.node(), [w.encode() for w in args.words[1:]])

    def _deliver(self, args: Args) -> None:
        source, target = args.option("from"), args.option("to")
        kind = args.options.get("type")

        def match(e: Envelope) -> bool:
            return (
                source in (None, e.source)
                and target in (None, e.destination)
                and kind in (None, kind_of(e))
            )

        if not self.cluster.deliver(match, drop="drop" in args.words):
            self.cluster.trace.append("no messages")

    def _cut(self, words: Sequence[str], heal: bool) -> None:
        cluster = self.cluster
        if heal and not words:
            cluster.cut.clear()
            return
        links = _links(words, list(cluster.nodes))
        cluster.cut = cluster.cut - links if heal else cluster.cut | links

    def _status(self, args: Args) -> list[str]:
        del args
        cluster = self.cluster
        lines = []
        for node_id, node in cluster.nodes.items():
            if node_id in cluster.down:
                lines.append(f"{node_id}: down log=[{cluster.bounds(node)})")
            else:
                lines.append(fmt_status(node_id, node.core, node.state.voted_for))
        return lines

    def _log(self, args: Args) -> list[str]:
        node = self.cluster.nodes[args.node()]
        lines = [f"{fmt_batch(b)} {fmt_contents(b)}" for b in node.log] or ["empty"]
        return [*lines, f"applied: {fmt_records(node.applied) or '-'}"]


# -- files -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    line: int  # 1-based line number of the command
    command: str
    expected: tuple[str, ...]


def parse(text: str, name: str) -> list[str | Case]:
    """Story lines (kept verbatim) and cases, in file order."""
    lines, items, i = text.splitlines(), list[str | Case](), 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            items.append(line)
            i += 1
            continue
        if i + 1 >= len(lines) or lines[i + 1] != "----":
            raise ScenarioError(f"{name}:{i + 1}: `----` expected after {line!r}")
        end = i + 2
        while end < len(lines) and lines[end].strip():
            end += 1
        items.append(Case(i + 1, line, tuple(lines[i + 2 : end])))
        i = end
    return items


def _diff(path: Path, case: Case, actual: Sequence[str]) -> str:
    diff = difflib.unified_diff(
        case.expected, actual, "expected", "actual", lineterm="", n=len(actual)
    )
    return f"{path}:{case.line}: {case.command}\n" + "\n".join(diff)


def check_file(path: Path, rewrite: bool | None = None) -> None:
    """Run a scenario file; raise AssertionError listing every mismatch, or, in rewrite
    mode, write the actual output back into the file."""
    if rewrite is None:
        rewrite = os.environ.get(REWRITE_ENV) == "1"
    interpreter, failures, out = Interpreter(), list[str](), list[str]()
    for item in parse(path.read_text(), str(path)):
        if isinstance(item, str):
            out.append(item)
            continue
        try:
            actual = interpreter.execute(item.command)
        except Exception as e:
            e.add_note(f"at {path}:{item.line}: {item.command}")
            raise
        out += [item.command, "----", *actual]
        if tuple(actual) != item.expected:
            failures.append(_diff(path, item, actual))
    if rewrite:
        path.write_text("\n".join(out) + "\n")
        if failures:  # a rewrite is for a person to review, never a pass
            raise AssertionError(f"rewrote {path}: review its diff\n\n" + "\n\n".join(failures))
    elif failures:
        raise AssertionError("\n\n".join(failures))
