#!/usr/bin/env python3
"""Turns the recorded CUDA memory snapshots in ../shared/alloc_traces/ into the committed event
files in tests/alloc_traces/data/, which alloc_traces_test replays through the engine's
allocator model (tests/alloc_traces/README.md describes the format and cites every source).

A snapshot (torch.cuda.memory._dump_snapshot) holds the allocator's state at its end
(`segments`, each with its blocks) and, per device, the events recorded before it
(`device_traces`). Most recordings begin mid-run, so the state at the first event is rebuilt
by walking the events back from the end state: a segment_alloc undone removes its segment, a
segment_free undone restores it, an alloc undone frees its block, a free undone makes its
block live again. What is left is written out with the events in order, buffer and stream
identities remapped to small integers, segment addresses as their ranks, and the figures read
off the trace: the reserved bytes after every allocation, the peak, the end and the number of
segments. A run of segment_free/segment_unmap events is a release of the cache: a failed
cudaMalloc's when the segment it was for follows (the model must release by itself: the file
gives the range of device capacities the trace allows), else torch.cuda.empty_cache().

Usage:
  extract.py [--traces DIR] [--out DIR]   write the event files (and nothing else)
  extract.py --check [--traces DIR]       exit 1 unless the committed files are reproduced
                                          byte for byte (exit 77, skipped, without DIR)
Needs only the standard library (lzma, pickle): run it with /usr/bin/python3.
"""

import argparse
import glob
import lzma
import os
import pickle
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_TRACES = os.path.join(os.path.dirname(REPO), "shared", "alloc_traces")
DEFAULT_OUT = os.path.join(HERE, "data")

SMALL_SEGMENT = 2 << 20  # every small-pool segment, and only those, is 2 MiB (no expandable)
SMALL_SIZE = 1 << 20     # the small pool's largest block; large-pool blocks are all larger


class TraceError(Exception):
    pass


def round_size(n):
    return 512 if n < 512 else (n + 511) // 512 * 512


def read_sources(traces_dir):
    """The README's table: one row per file in traces/, in the same (sorted) order."""
    rows = []
    with open(os.path.join(traces_dir, "README.md"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^\| (\S+/\S+) \| `([^`]+)` @ `([0-9a-f]+)` \| (\S+) \|$", line)
            if m:
                rows.append(dict(repo=m.group(1), path=m.group(2), commit=m.group(3),
                                 torch=m.group(4)))
    files = sorted(glob.glob(os.path.join(traces_dir, "traces", "*.pickle.xz")))
    if len(rows) != len(files):
        raise TraceError(f"README lists {len(rows)} sources for {len(files)} files")
    sources = {}
    for row, path in zip(rows, files):
        name = os.path.basename(path)[: -len(".pickle.xz")]
        owner_repo = row["repo"].replace("/", "__")
        if not name.startswith(owner_repo + "__" + row["path"].replace("/", "_") + "__"):
            raise TraceError(f"README row {row['repo']} {row['path']} does not name {name}")
        sources[path] = row
    return sources


def rebuild_start(segments, events, expandable):
    """The segments and live blocks at the first event, from the end state walked back.

    Returns (segments, live): segments maps address -> [bytes, stream]; live maps a block's
    address -> [requested bytes, block bytes known from the end state or None].
    """
    segs = {s["address"]: [s["total_size"], s["stream"]] for s in segments}
    live = {}
    for s in segments:
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                live[b["address"]] = [b["requested_size"], b["size"]]
            elif b["state"] != "inactive":
                raise TraceError(f"block state {b['state']} (a free waiting on a stream)")
    mapped = 0
    for e in reversed(events):
        a = e["action"]
        if a == "alloc":
            if e["addr"] not in live:
                raise TraceError(f"alloc at {e['addr']:#x} of a block not live after it")
            del live[e["addr"]]
        elif a == "free_completed":
            if e["addr"] in live:
                raise TraceError(f"free at {e['addr']:#x} of a block live before it")
            live[e["addr"]] = [e["size"], None]
        elif a == "segment_alloc":
            if segs.pop(e["addr"], None) is None:
                raise TraceError(f"segment_alloc at {e['addr']:#x} not in the end state")
        elif a == "segment_free":
            if e["addr"] in segs:
                raise TraceError(f"segment_free at {e['addr']:#x} of a segment still there")
            segs[e["addr"]] = [e["size"], e["stream"]]
        elif a == "segment_map":
            mapped += e["size"]
        elif a == "segment_unmap":
            mapped -= e["size"]
    if expandable:
        # Expandable segments are reported as their mapped ranges; every recording of them
        # here starts from an empty allocator, which is all the replay supports.
        if mapped != sum(v[0] for v in segs.values()) or live:
            raise TraceError("an expandable-segments trace that does not start empty")
        return {}, {}
    return segs, live


def block_sizes(segs, live):
    """Each start block's segment, offset and size. A block freed during the trace is known
    only by its request: its size is the request rounded to 512 B, and in the large pool also
    the rest of its segment region when that is 1 MiB or less (a large block is split only when
    more than 1 MiB would remain, and every large-pool block is larger than 1 MiB, so such a
    tail cannot be a block of its own)."""
    seg_addrs = sorted(segs)
    placed = []
    for addr in sorted(live):
        req, size = live[addr]
        i = max((k for k, s in enumerate(seg_addrs) if s <= addr), default=None)
        if i is None or addr >= seg_addrs[i] + segs[seg_addrs[i]][0]:
            raise TraceError(f"start block at {addr:#x} lies in no segment")
        placed.append([addr, i, req, size])
    for k, p in enumerate(placed):
        addr, i, req, size = p
        if size is not None:
            continue
        size = round_size(req)
        seg_addr = seg_addrs[i]
        seg_bytes = segs[seg_addr][0]
        boundary = seg_addr + seg_bytes
        if k + 1 < len(placed) and placed[k + 1][1] == i:
            boundary = placed[k + 1][0]
        gap = boundary - (addr + size)
        if seg_bytes != SMALL_SEGMENT and 0 < gap <= SMALL_SIZE:
            size += gap
        p[3] = size
    for k, (addr, i, req, size) in enumerate(placed):
        end = seg_addrs[i] + segs[seg_addrs[i]][0]
        nxt = placed[k + 1][0] if k + 1 < len(placed) and placed[k + 1][1] == i else end
        if addr + size > nxt:
            raise TraceError(f"start block at {addr:#x} overlaps what follows it")
    return seg_addrs, placed


def convert(path, device, events, segments, source):
    expandable = any(s.get("is_expandable") for s in segments)
    if expandable and not all(s.get("is_expandable") for s in segments):
        raise TraceError("expandable and plain segments mixed")
    segs, live = rebuild_start(segments, events, expandable)
    seg_addrs, placed = block_sizes(segs, live)

    streams = {0: 0}

    def stream_id(s):
        if s not in streams:
            streams[s] = len(streams)
        return streams[s]

    for a in seg_addrs:
        stream_id(segs[a][1])
    for e in events:
        if "stream" in e and e["action"] != "snapshot":
            stream_id(e["stream"])

    # Best fit breaks ties by address, and the driver chose the addresses: every segment's
    # address is given by its rank among all the segment addresses of the trace.
    ranks = sorted(set(seg_addrs) | {e["addr"] for e in events if e["action"] == "segment_alloc"})
    ranks = {a: k for k, a in enumerate(ranks)}
    new_segment = None

    reserved = sum(v[0] for v in segs.values())
    peak = reserved
    first_alloc = next((k for k, e in enumerate(events) if e["action"] == "alloc"), len(events))
    handles = {}
    next_handle = 0
    out = []
    lo, hi = 0, None  # the device capacities consistent with what cudaMalloc did
    printed = reserved
    counts = dict(allocs=0, frees=0, retries=0, empty_cache=0, ooms=0)
    for addr, i, req, size in placed:
        handles[addr] = next_handle
        next_handle += 1

    k = 0
    while k < len(events):
        e = events[k]
        a = e["action"]
        if a in ("segment_free", "segment_unmap"):
            j, freed = k, 0
            while j < len(events) and events[j]["action"] in ("segment_free", "segment_unmap"):
                freed += events[j]["size"]
                j += 1
            nxt = events[j]["action"] if j < len(events) else None
            if k >= first_alloc and nxt in ("segment_alloc", "segment_map"):
                # cudaMalloc failed, every cached free segment was released, and it was tried
                # again: the capacity is below the first try and at least the second.
                need = events[j]["size"]
                hi = reserved + need - 1 if hi is None else min(hi, reserved + need - 1)
                lo = max(lo, reserved - freed + need)
                counts["retries"] += 1
                reserved -= freed
            elif nxt == "oom":
                reserved -= freed  # the release before the last, failed try
            else:
                # torch.cuda.empty_cache(), or a release before the recording's first
                # allocation, whose cause it does not show.
                reserved -= freed
                out.append(f"e r{reserved}")
                printed = reserved
                counts["empty_cache"] += 1
            k = j
            continue
        if a == "segment_alloc":
            new_segment = ranks[e["addr"]]
        if a in ("segment_alloc", "segment_map"):
            reserved += e["size"]
            lo = max(lo, reserved)
            peak = max(peak, reserved)
        elif a == "alloc":
            handles[e["addr"]] = next_handle
            next_handle += 1
            line = f"a {e['size']}"
            if reserved != printed:
                line += f" r{reserved}"
                printed = reserved
            if stream_id(e["stream"]):
                line += f" s{stream_id(e['stream'])}"
            if new_segment is not None:
                line += f" g{new_segment}"
                new_segment = None
            out.append(line)
            counts["allocs"] += 1
        elif a == "free_completed":
            out.append(f"f {handles.pop(e['addr'])}")
            counts["frees"] += 1
        elif a == "oom":
            # The request failed after the release: the capacity is below the reserved bytes
            # plus what cudaMemGetInfo reported free then.
            cap = reserved + e["device_free"]
            hi = cap if hi is None else min(hi, cap)
            line = f"o {e['size']} r{reserved}"
            if stream_id(e["stream"]):
                line += f" s{stream_id(e['stream'])}"
            out.append(line)
            printed = reserved
            counts["ooms"] += 1
        elif a not in ("free_requested", "snapshot"):
            raise TraceError(f"unknown action {a}")
        k += 1

    end = sum(s["total_size"] for s in segments)
    if reserved != end:
        raise TraceError(f"the events end at {reserved} reserved, the snapshot at {end}")
    if hi is not None and lo > hi:
        raise TraceError(f"no capacity fits the retries: {lo} > {hi}")

    name = os.path.basename(path)[: -len(".pickle.xz")]
    head = [
        "# memest allocator trace v1: derived by tests/alloc_traces/extract.py; the format is in",
        "# tests/alloc_traces/README.md.",
        f"# source: {source['repo']} {source['path']} @ {source['commit']}, torch {source['torch']}",
        f"# file: {name}.pickle.xz, device {device}",
        f"# events: {counts['allocs']} allocs, {counts['frees']} frees, "
        f"{counts['retries']} cudaMalloc retries, {counts['empty_cache']} empty_cache, "
        f"{counts['ooms']} ooms, {len(streams)} streams",
        f"expandable {1 if expandable else 0}",
        f"capacity {lo if hi is not None else 0} {hi if hi is not None else 0}",
    ]
    for a in seg_addrs:
        head.append(f"segment {stream_id(segs[a][1])} {segs[a][0]} {ranks[a]}")
    for addr, i, req, size in placed:
        head.append(f"block {i} {addr - seg_addrs[i]} {size}")
    head.append("events")
    tail = [f"end {peak} {reserved} {len(segments)}"]
    return "\n".join(head + out + tail) + "\n"


def outputs(traces_dir):
    """(file name, text) for every device trace, in order."""
    sources = read_sources(traces_dir)
    result = []
    for path in sorted(sources):
        with lzma.open(path) as f:
            snap = pickle.load(f)
        traces = snap["device_traces"]
        used = [d for d, t in enumerate(traces) if t]
        name = os.path.basename(path)[: -len(".pickle.xz")]
        for d in used:
            segments = [s for s in snap["segments"] if s["device"] == d]
            try:
                text = convert(path, d, traces[d], segments, sources[path])
            except TraceError as err:
                raise TraceError(f"{name} device {d}: {err}") from None
            suffix = f".dev{d}" if len(used) > 1 else ""
            result.append((f"{name}{suffix}.txt", text))
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default=DEFAULT_TRACES)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true",
                    help="compare with the files in --out instead of writing them")
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(args.traces, "traces")):
        print(f"no traces in {args.traces}: skipped")
        return 77 if args.check else 1
    try:
        files = outputs(args.traces)
    except TraceError as err:
        print(f"extract.py: {err}", file=sys.stderr)
        return 1
    if args.check:
        bad = 0
        committed = set(os.path.basename(p) for p in glob.glob(os.path.join(args.out, "*.txt")))
        for name, text in files:
            p = os.path.join(args.out, name)
            if not os.path.exists(p) or open(p, encoding="utf-8").read() != text:
                print(f"differs: {name}")
                bad += 1
            committed.discard(name)
        for name in sorted(committed):
            print(f"not derived from any trace: {name}")
            bad += 1
        print(f"{len(files) - bad} of {len(files)} event files reproduced byte for byte")
        return 1 if bad else 0
    os.makedirs(args.out, exist_ok=True)
    for name, text in files:
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write(text)
    print(f"wrote {len(files)} event files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
