"""Writes DLRMv4's data: Yambda's parquet events as streaming window records, and the mini set.

`mlperf-tf prepare dlrmv4 --input_dir=YAMBDA --output_dir=DIR` reads Yambda's released flat
events (`multi_event.parquet`: uid, timestamp, item_id, is_organic, event_type,
played_ratio_pct, ...; `artist_item_mapping.parquet`, `album_item_mapping.parquet`) and writes
one TFRecord file per time window (`input.py` names the features) and `manifest.json`. As the
reference's `yambda.py`: a sample is one anchor listen, its label `listen_plus`
(played_ratio_pct >= 50), its history the user's earlier listen+ / like / skip events with
their bits 1 / 2 / 4 in `action_weight`, its contextual tokens `uid` and the seven xxhash64
cross ids of `configs.py YAMBDA_5B_CROSS_SPECS`.

Two streaming passes, never the whole set in memory: (1) the parquet's record batches are
bucketed by window into `.npz` chunks (resumable by batch); (2) windows in time order, one in
memory at a time, each user's last 2 x H events kept in an on-disk ring (a memmap, 9 bytes an
event) whose per-user counts are saved after every window, so a stopped run resumes at the first
unfinished window exactly. A progress line reports both passes.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time

import numpy as np

from benchmarks.dlrmv4 import config as config_lib
from benchmarks.dlrmv4.input import MANIFEST
from mlperf_tf.errors import UserError

LISTEN_PLUS_THRESHOLD = 50  # yambda.py
LP_BIT, LIKE_BIT, SKIP_BIT = 1, 2, 4
EVENT_TYPES = {"listen": 0, "like": 1}  # the events a history keeps; others are dropped
# configs.py YAMBDA_5B_CROSS_SPECS keys, in CROSS_FEATURES order.
CROSS_KEYS = (
    ("uid", "artist_id"),
    ("uid", "album_id"),
    ("uid", "hour_of_day"),
    ("item_id", "hour_of_day"),
    ("artist_id", "hour_of_day"),
    ("uid", "is_organic"),
    ("uid", "artist_id", "hour_of_day"),
)

_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5, _MASK = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5, (1 << 64) - 1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of `data` shorter than 32 bytes (the cross keys: 16 or 24), in pure Python so
    that the ids match the reference's `xxhash_cross` without the `xxhash` package."""
    if len(data) >= 32:
        raise ValueError("xxh64 here takes fewer than 32 bytes")
    h = (seed + _P5 + len(data)) & _MASK
    i = 0
    while i + 8 <= len(data):
        (lane,) = struct.unpack_from("<Q", data, i)
        k = (_rotl((lane * _P2) & _MASK, 31) * _P1) & _MASK
        h = ((_rotl(h ^ k, 27) * _P1) + _P4) & _MASK
        i += 8
    if i + 4 <= len(data):
        (lane,) = struct.unpack_from("<I", data, i)
        h = ((_rotl(h ^ ((lane * _P1) & _MASK), 23) * _P2) + _P3) & _MASK
        i += 4
    while i < len(data):
        h = (_rotl(h ^ ((data[i] * _P5) & _MASK), 11) * _P1) & _MASK
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _MASK
    h ^= h >> 29
    h = (h * _P3) & _MASK
    return h ^ (h >> 32)


def cross_ids(anchor: dict[str, int], rows: tuple[int, ...]) -> list[int]:
    """The seven cross ids of one anchor (`xxhash_cross`: xxh64, seed 0, of the keys as
    little-endian int64, mod the table's rows)."""
    return [
        xxh64(struct.pack(f"<{len(keys)}q", *(anchor[k] for k in keys))) % n
        for keys, n in zip(CROSS_KEYS, rows)
    ]


def _example(history, contextual, candidate, label) -> bytes:
    """One record (the features `input.parse_fn` reads)."""
    import tensorflow as tf  # noqa: PLC0415

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

    items, artists, albums, actions, times = history
    features = {
        "uih_item": ints(items), "uih_artist": ints(artists), "uih_album": ints(albums),
        "uih_action": ints(actions), "uih_time": ints(times), "contextual": ints(contextual),
        "cand_item": ints([candidate[0]]), "cand_artist": ints([candidate[1]]),
        "cand_album": ints([candidate[2]]), "cand_time": ints([candidate[3]]),
        "label": ints([label]),
    }  # fmt: skip
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


class _Progress:
    """One progress line on stderr, rewritten at most every half second."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.shown = what, total, 0.0

    def update(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.shown > 0.5:
            self.shown = now
            end = "\n" if done >= self.total else ""
            sys.stderr.write(f"\r{self.what}: {done}/{self.total}{end}")
            sys.stderr.flush()


# ---- Yambda: pass 1, bucket events by window -----------------------------------------------------
def _read_mapping(path: str, column: str) -> np.ndarray:
    """item_id -> `column` as a dense array (0 for items without one)."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    table = pq.read_table(path, columns=["item_id", column])
    items = table["item_id"].to_numpy().astype(np.int64)
    values = table[column].to_numpy().astype(np.int64)
    out = np.zeros(int(items.max()) + 1 if len(items) else 1, np.int64)
    out[items] = values
    return out


def bucket_events(events_path: str, work_dir: str, window_seconds: int) -> dict:
    """Pass 1: the parquet's record batches into per-window `.npz` chunks; returns the state
    (windows seen, first timestamp). Resumable: a batch whose chunks exist is skipped."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    try:
        parquet = pq.ParquetFile(events_path)
    except Exception as e:  # noqa: BLE001 (pyarrow's errors differ by corruption)
        raise UserError(f"{events_path} is not a readable parquet file: {e}") from None
    state_path = os.path.join(work_dir, "pass1.json")
    state = {"batches_done": 0, "t0": None, "windows": []}
    if os.path.exists(state_path):
        with open(state_path) as f:
            state = json.load(f)
    meta = parquet.metadata
    progress = _Progress("dlrmv4 prepare: pass 1, row groups", meta.num_row_groups)
    columns = ["uid", "timestamp", "item_id", "is_organic", "event_type", "played_ratio_pct"]
    for group in range(state["batches_done"], meta.num_row_groups):
        t = parquet.read_row_group(group, columns=columns)
        ts = t["timestamp"].to_numpy().astype(np.int64)
        if state["t0"] is None:
            state["t0"] = int(ts.min()) if len(ts) else 0
        kinds = np.array([EVENT_TYPES.get(str(k), -1) for k in t["event_type"].to_pylist()])
        ratio = t["played_ratio_pct"].fill_null(0).to_numpy().astype(np.int64)
        keep = kinds >= 0
        window = (ts - state["t0"]) // window_seconds
        if (window[keep] < 0).any():
            raise UserError(
                f"{events_path}: row group {group} has events before the first row group's "
                "first timestamp: sort the events by time before preparing"
            )
        cols = {
            "uid": t["uid"].to_numpy().astype(np.int64),
            "ts": ts,
            "item": t["item_id"].to_numpy().astype(np.int64),
            "organic": t["is_organic"].to_numpy().astype(np.int64),
            "kind": kinds,
            "ratio": ratio,
        }
        for w in np.unique(window[keep]):
            sel = keep & (window == w)
            np.savez(
                os.path.join(work_dir, f"bucket-{int(w):05d}-{group:06d}.npz"),
                **{k: v[sel] for k, v in cols.items()},
            )
            if int(w) not in state["windows"]:
                state["windows"].append(int(w))
        state["batches_done"] = group + 1
        with open(state_path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(state_path + ".tmp", state_path)
        progress.update(group + 1)
    progress.update(meta.num_row_groups, force=True)
    state["windows"].sort()
    return state


# ---- pass 2: windows in time order, histories from an on-disk ring ------------------------------
class _HistoryRing:
    """Each user's last `capacity` events (item, time, action) in memmaps, with counts.

    A window's replay after a stop reads the same events it wrote before (capacity is twice the
    kept history, and the counts are restored from the window's start), so resuming is exact.
    """

    def __init__(self, work_dir: str, users: int, capacity: int):
        self.capacity = capacity
        shape = (users, capacity)

        def array(name, dtype):
            path = os.path.join(work_dir, f"ring-{name}.npy")
            mode = "r+" if os.path.exists(path) else "w+"
            return np.lib.format.open_memmap(path, mode=mode, dtype=dtype, shape=shape)

        self.item = array("item", np.uint32)
        self.time = array("time", np.int64)
        self.action = array("action", np.uint8)
        self.counts = np.zeros(users, np.int64)

    def last(self, uid: int, n: int):
        count = int(self.counts[uid])
        start = max(0, count - n)
        slots = np.arange(start, count) % self.capacity
        return self.item[uid, slots], self.time[uid, slots], self.action[uid, slots]

    def append(self, uid: int, item: int, ts: int, action: int) -> None:
        slot = int(self.counts[uid]) % self.capacity
        self.item[uid, slot], self.time[uid, slot], self.action[uid, slot] = item, ts, action
        self.counts[uid] += 1


def write_windows(state: dict, work_dir: str, out_dir: str, *, history: int, users: int,
                  artist_of: np.ndarray, album_of: np.ndarray, rows: tuple[int, ...]) -> dict:  # fmt: skip
    """Pass 2: one TFRecord per window in time order (the last is the eval window); returns
    the manifest. Resumable at the first window without a finished record file."""
    import tensorflow as tf  # noqa: PLC0415

    ring = _HistoryRing(work_dir, users, 2 * history)
    windows = state["windows"]
    progress = _Progress("dlrmv4 prepare: pass 2, windows", len(windows))
    manifest_windows, max_ids = [], {"item_id": 0, "artist_id": 0, "album_id": 0, "uid": 0}
    done_path = os.path.join(work_dir, "pass2.json")
    done = json.load(open(done_path)) if os.path.exists(done_path) else {"windows": []}
    for index, w in enumerate(windows):
        name = "eval.tfrecord" if index == len(windows) - 1 else f"train-{w:05d}.tfrecord"
        counts_path = os.path.join(work_dir, f"counts-{w:05d}.npy")
        if index < len(done["windows"]):
            entry = done["windows"][index]
            manifest_windows.append(entry["window"])
            for k, v in entry["max_ids"].items():
                max_ids[k] = max(max_ids[k], v)
            ring.counts = np.load(os.path.join(work_dir, f"counts-after-{w:05d}.npy"))
            progress.update(index + 1)
            continue
        np.save(counts_path, ring.counts)  # the window's start: a replay restores it
        chunks = sorted(f for f in os.listdir(work_dir) if f.startswith(f"bucket-{w:05d}-"))
        parts = [dict(np.load(os.path.join(work_dir, f))) for f in chunks]
        ev = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.lexsort((ev["uid"], ev["ts"]))  # time order, ties by user
        ev = {k: v[order] for k, v in ev.items()}
        if int(ev["uid"].max()) >= users:
            raise UserError(f"window {w}: uid {int(ev['uid'].max())} outside {users} users")
        samples = 0
        start = state["t0"] + w * state["window_seconds"]
        with tf.io.TFRecordWriter(os.path.join(out_dir, name + ".tmp")) as writer:
            for i in range(len(ev["uid"])):
                uid, item, ts = int(ev["uid"][i]), int(ev["item"][i]), int(ev["ts"][i])
                artist = int(artist_of[item]) if item < len(artist_of) else 0
                album = int(album_of[item]) if item < len(album_of) else 0
                for key, value in (("item_id", item), ("artist_id", artist),
                                   ("album_id", album), ("uid", uid)):  # fmt: skip
                    max_ids[key] = max(max_ids[key], value)
                if ev["kind"][i] == EVENT_TYPES["like"]:
                    ring.append(uid, item, ts, LIKE_BIT)
                    continue
                label = int(ev["ratio"][i] >= LISTEN_PLUS_THRESHOLD)
                h_items, h_times, h_actions = ring.last(uid, history)
                h_items = h_items.astype(np.int64)
                h_art = np.where(
                    h_items < len(artist_of), artist_of[np.minimum(h_items, len(artist_of) - 1)], 0
                )
                h_alb = np.where(h_items < len(album_of),
                                 album_of[np.minimum(h_items, len(album_of) - 1)], 0)  # fmt: skip
                anchor = {
                    "uid": uid, "item_id": item, "artist_id": artist, "album_id": album,
                    "hour_of_day": (ts // 3600) % 24, "is_organic": int(ev["organic"][i]),
                }  # fmt: skip
                query = int(h_times[-1]) if len(h_times) else ts  # yambda.py dummy_query_time
                writer.write(_example(
                    (h_items, h_art, h_alb, h_actions, h_times),
                    [uid, *cross_ids(anchor, rows)], (item, artist, album, query), label,
                ))  # fmt: skip
                samples += 1
                ring.append(uid, item, ts, LP_BIT if label else SKIP_BIT)
        os.replace(os.path.join(out_dir, name + ".tmp"), os.path.join(out_dir, name))
        for array in (ring.item, ring.time, ring.action):
            array.flush()
        np.save(os.path.join(work_dir, f"counts-after-{w:05d}.npy"), ring.counts)
        entry = {"file": name, "start": start, "end": start + state["window_seconds"],
                 "samples": samples}  # fmt: skip
        manifest_windows.append(entry)
        done["windows"].append({"window": entry, "max_ids": dict(max_ids)})
        with open(done_path + ".tmp", "w") as f:
            json.dump(done, f)
        os.replace(done_path + ".tmp", done_path)
        progress.update(index + 1)
    return {
        "train_windows": manifest_windows[:-1],
        "eval_window": manifest_windows[-1],
        "table_rows": {k: v + 1 for k, v in max_ids.items()},
        "history_length": history,
    }


def prepare(input_dir: str, output_dir: str, *, window_seconds: int = 86_400,
            history: int | None = None, users: int | None = None) -> dict:  # fmt: skip
    """Yambda's parquet files in `input_dir` -> window records and `manifest.json` in
    `output_dir` (resumable). Returns the manifest.

    Raises:
      UserError: a file is missing or corrupt, or the events are not in time order.
    """
    model = config_lib.ModelConfig()
    history = history or model.history_length
    paths = {
        name: os.path.join(input_dir, f"{name}.parquet")
        for name in ("multi_event", "artist_item_mapping", "album_item_mapping")
    }
    for path in paths.values():
        if not os.path.exists(path):
            raise UserError(f"--input_dir {input_dir} has no {os.path.basename(path)} (Yambda)")
    work_dir = os.path.join(output_dir, "work")
    os.makedirs(work_dir, exist_ok=True)
    state = bucket_events(paths["multi_event"], work_dir, window_seconds)
    state["window_seconds"] = window_seconds
    if len(state["windows"]) < 2:
        raise UserError("Yambda events span fewer than two windows: nothing to train and eval")
    artist_of = _read_mapping(paths["artist_item_mapping"], "artist_id")
    album_of = _read_mapping(paths["album_item_mapping"], "album_id")
    if users is None:
        import pyarrow.compute as pc  # noqa: PLC0415
        import pyarrow.parquet as pq  # noqa: PLC0415

        pf = pq.ParquetFile(paths["multi_event"])
        users = 1 + max(
            int(pc.max(pf.read_row_group(g, columns=["uid"])["uid"]).as_py() or 0)
            for g in range(pf.metadata.num_row_groups)
        )
    manifest = write_windows(
        state, work_dir, output_dir, history=history, users=users, artist_of=artist_of,
        album_of=album_of, rows=tuple(model.cross_rows),
    )  # fmt: skip
    with open(os.path.join(output_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


# ---- the mini data set ---------------------------------------------------------------------------
MINI_BASELINE_WINDOWS = 5  # the days a mini run reads before its target (163,840 listens)


def prepare_mini(data_dir: str) -> dict:
    """Writes the mini set: the manifest of the generated stream (`mini_stream.MiniStream`, its
    500 training days made as the run reads them) and the eval window, the day after the
    stream, as records (histories of the mini config's length). Runs the whole stream once for
    its state (each user's last events and tastes), one day at a time, keeping none of it.

    Returns a summary with the eval window's AUC of the generator's own probabilities (the best
    possible) and of an item-popularity baseline (each item's listen+ rate over the first
    `MINI_BASELINE_WINDOWS` days, what a run reads before its target, and over the whole
    stream).
    """
    import tensorflow as tf  # noqa: PLC0415

    from benchmarks.dlrmv4.mini_stream import MiniStream  # noqa: PLC0415
    from mlperf_tf.prepare_cli import staged_folder  # noqa: PLC0415

    c = config_lib
    model = c.mini_model()
    seed, days, per_day = 0, c.MINI_TRAIN_WINDOWS, c.MINI_WINDOW_SAMPLES
    stream = MiniStream(seed=seed, history=model.history_length, cross_rows=model.cross_rows)
    listens = {k: np.zeros(c.MINI_ITEMS) for k in ("first", "all")}
    plus = {k: np.zeros(c.MINI_ITEMS) for k in ("first", "all")}
    progress = _Progress("mini stream days", days)
    state = stream.initial_state()
    for day in range(days):
        events, state = stream.day(day, state, per_day)
        for key in ("first", "all") if day < MINI_BASELINE_WINDOWS else ("all",):
            listens[key] += np.bincount(events["item"], minlength=c.MINI_ITEMS)
            plus[key] += np.bincount(events["item"], events["label"], c.MINI_ITEMS)
        progress.update(day + 1)
    progress.update(days, force=True)
    events, _ = stream.day(days, state, c.MINI_EVAL_SAMPLES)
    examples = stream.examples(events)
    with staged_folder(data_dir) as out:
        with tf.io.TFRecordWriter(os.path.join(out, "eval.tfrecord")) as writer:
            for i in range(c.MINI_EVAL_SAMPLES):
                n = int(examples["uih_length"][i])
                history = [examples[k][i, :n] for k in ("uih_item", "uih_artist", "uih_album",
                                                        "uih_action", "uih_time")]  # fmt: skip
                candidate = [examples[k][i] for k in ("cand_item", "cand_artist", "cand_album",
                                                      "cand_time")]  # fmt: skip
                writer.write(_example(history, examples["contextual"][i], candidate,
                                      int(examples["label"][i])))  # fmt: skip
        manifest = {
            # `input.train_dataset` generates these days (no files) from this.
            "generator": {"seed": seed, "window_samples": per_day},
            "train_windows": [
                {
                    "file": f"generated day {d}",
                    "start": d * 86_400,
                    "end": (d + 1) * 86_400,
                    "samples": per_day,
                }  # fmt: skip
                for d in range(days)
            ],
            "eval_window": {
                "file": "eval.tfrecord",
                "start": days * 86_400,
                "end": (days + 1) * 86_400,
                "samples": c.MINI_EVAL_SAMPLES,
            },  # fmt: skip
            "table_rows": {
                "item_id": c.MINI_ITEMS,
                "artist_id": c.MINI_ARTISTS,
                "album_id": c.MINI_ALBUMS,
                "uid": c.MINI_USERS,
            },
            "history_length": model.history_length,
        }
        with open(os.path.join(out, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
    labels = events["label"]
    summary = {"windows": days + 1, "best_auc": _auc(events["chance"], labels)}
    for key in ("first", "all"):
        rate = (plus[key] + 1) / (listens[key] + 2)
        summary[f"popularity_auc_{key}"] = _auc(rate[events["item"]], labels)
    return summary


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact AUC (ties count half) of `scores` for binary `labels`."""
    order = np.argsort(scores, kind="stable")
    s, y = scores[order], labels[order]
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    ranks = np.repeat(first + (counts + 1) / 2.0, counts)  # average 1-based ranks of ties
    pos = y.sum()
    neg = len(y) - pos
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def main(argv=None) -> int:
    """`mlperf-tf prepare dlrmv4 --input_dir=YAMBDA --out_dir=DIR` (or `--mini --out_dir=DIR`)."""
    from mlperf_tf import prepare_cli  # noqa: PLC0415

    parser = prepare_cli.parser(
        config_lib.NAME, __doc__.split("\n")[0], mini_help="write the generated mini data set"
    )
    parser.add_argument("--input_dir", default="", help="Yambda's parquet files")
    parser.add_argument("--window_seconds", type=int, default=86_400)
    args = parser.parse_args(argv)
    if args.mini:
        print(json.dumps(prepare_mini(args.out_dir)))
        return 0
    if not args.input_dir:
        raise UserError("--input_dir (Yambda's parquet files) is required without --mini")
    prepare_cli.require_positive(args, ["window_seconds"], most=10**9)
    manifest = prepare(args.input_dir, args.out_dir, window_seconds=args.window_seconds)
    print(json.dumps({"windows": 1 + len(manifest["train_windows"])}))
    return 0


if __name__ == "__main__":
    from mlperf_tf import prepare_cli

    prepare_cli.module_main(main)
