"""Provides `MiniStream`, the `mini` preset's generated listening stream, one window at a time.

The rules evaluate every 0.1 % of the training stream (`eval_every_data_pct` 0.001). For the
mini to do so truthfully with evals no more often than a CPU affords, its stream is long
(`config.MINI_TRAIN_WINDOWS` days, 1,000 eval intervals) and a run reads only its start. So the
stream is never written nor held: each day is drawn from its own random stream
(`default_rng([seed, day])`) given the state the previous days leave (each user's last H events
and current tastes), vectorized over the day's events. Training reads the days in order through
`input.train_dataset` as they are made; `prepare.prepare_mini` runs the whole stream once for
its state only, to write the fixed eval window after it (the reference's `EVAL_HOLDOUT_TS`: the
window just past the whole training range, the same set at every eval).

The world: items in albums (5) and artists (40 items each), an artist plays one of 10 genres.
Each user likes two genres; at the start of each day after the first, with probability
`SWAP_CHANCE`, one of them is swapped for a genre the user does not like (the drift: a day's
tastes show only in the user's recent history). A listen's item is drawn half from the user's
liked genres, half from a popularity law; it is `listen_plus` with probability
sigmoid(4.0 [genre liked now] + 0.3 quality(item) + 0.6 [artist in the user's last H events]
- 2.2).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from benchmarks.dlrmv4 import config as config_lib
from benchmarks.dlrmv4.prepare import CROSS_KEYS, LP_BIT, SKIP_BIT

GENRES = 10
SWAP_CHANCE = 0.2  # a user's chance, each day, of swapping one liked genre
DAY = 86_400
# xxh64's primes (`prepare.xxh64`), as uint64.
_P1, _P2, _P3, _P4, _P5 = (np.uint64(p) for p in (
    0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
    0x27D4EB2F165667C5,
))  # fmt: skip


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def xxh64_int64s(keys: np.ndarray) -> np.ndarray:
    """XXH64 (seed 0) of each row of `keys` [n, k] (k < 4) as k little-endian int64s, vectorized:
    `prepare.xxh64` of the packed row for every row (uint64 arithmetic wraps mod 2^64)."""
    keys = np.ascontiguousarray(keys, np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        h = np.full(len(keys), _P5 + np.uint64(8 * keys.shape[1]), np.uint64)
        for lane in keys.T:
            k = _rotl(lane * _P2, 31) * _P1
            h = _rotl(h ^ k, 27) * _P1 + _P4
        h ^= h >> np.uint64(33)
        h *= _P2
        h ^= h >> np.uint64(29)
        h *= _P3
    return h ^ (h >> np.uint64(32))


@dataclasses.dataclass
class StreamState:
    """What a day leaves the next: each user's last H events (right-aligned: the newest in the
    last column; `length` of them real), and the two genres each user likes now."""

    item: np.ndarray  # [users, H] int64
    time: np.ndarray  # [users, H] int64
    action: np.ndarray  # [users, H] int64
    length: np.ndarray  # [users] int64
    liked: np.ndarray  # [users, 2] int64


class MiniStream:
    """The mini's world and its days (module docstring), from `seed`.

    Args:
      seed: the world's and every day's random streams.
      history: H, the longest history a sample keeps (`ModelConfig.history_length`).
      cross_rows: the seven cross tables' rows (`ModelConfig.cross_rows`).
    """

    def __init__(self, *, seed: int = 0, history: int, cross_rows: tuple[int, ...]):
        c = config_lib
        self.seed, self.history, self.cross_rows = seed, history, tuple(cross_rows)
        rng = np.random.default_rng(seed)
        items = np.arange(c.MINI_ITEMS)
        self.artist_of = items // (c.MINI_ITEMS // c.MINI_ARTISTS)
        self.album_of = items // 5
        self.genre_of = self.artist_of % GENRES
        self.quality = rng.standard_normal(c.MINI_ITEMS)
        popularity = 1.0 / (1 + rng.permutation(c.MINI_ITEMS)) ** 0.8
        self.popularity = popularity / popularity.sum()
        self.by_genre = np.stack([items[self.genre_of == g] for g in range(GENRES)])
        self.initial_liked = np.stack(
            [rng.choice(GENRES, 2, replace=False) for _ in range(c.MINI_USERS)]
        )

    def initial_state(self) -> StreamState:
        """No events yet; the users' first tastes."""
        users, h = config_lib.MINI_USERS, self.history
        zeros = np.zeros((users, h), np.int64)
        return StreamState(item=zeros, time=zeros.copy(), action=zeros.copy(),
                           length=np.zeros(users, np.int64), liked=self.initial_liked.copy())  # fmt: skip

    def day(self, day: int, state: StreamState, count: int) -> tuple[dict, StreamState]:
        """Day `day`'s `count` listens, in time order, and the state after them.

        Returns events {uid, time, item, organic, label (int64 [count]), chance (float64, the
        generator's probability: the best AUC any model can reach), history_index ([count, H],
        the event's history as positions of `history_pool`, -1 none, oldest first),
        history_pool (item, time, action [users x (H + most events a user has this day)])}.
        """
        c = config_lib
        h, users = self.history, c.MINI_USERS
        rng = np.random.default_rng([self.seed, day])
        liked = state.liked.copy()
        if day > 0:  # the drift: swap one liked genre for one not liked
            swap = rng.random(users) < SWAP_CHANCE
            which = rng.integers(0, 2, users)
            low, high = liked.min(1), liked.max(1)
            new = rng.integers(0, GENRES - 2, users)
            new += new >= low
            new += new >= high
            liked[swap, which[swap]] = new[swap]
        time = np.sort(rng.integers(0, DAY, count)) + day * DAY
        uid = rng.integers(0, users, count)
        from_taste = rng.random(count) < 0.5
        taste = liked[uid, rng.integers(0, 2, count)]
        item = np.where(
            from_taste,
            self.by_genre[taste, rng.integers(0, self.by_genre.shape[1], count)],
            rng.choice(c.MINI_ITEMS, count, p=self.popularity),
        )
        draw, organic = rng.random(count), (rng.random(count) < 0.3).astype(np.int64)

        # Each user's events after its carried history: pool[u] = last H events ++ today's.
        order = np.argsort(uid, kind="stable")  # user-major, time order within a user
        per_user = np.bincount(uid, minlength=users)
        start = np.cumsum(per_user) - per_user
        rank = np.empty(count, np.int64)
        rank[order] = np.arange(count) - start[uid[order]]  # the event's place in its user's day
        width = h + int(per_user.max(initial=0))
        pool_item = np.zeros((users, width), np.int64)
        pool_time = np.zeros((users, width), np.int64)
        pool_item[:, :h], pool_time[:, :h] = state.item, state.time
        pool_item[uid, h + rank], pool_time[uid, h + rank] = item, time
        # The event's history: the H pool slots before it, the last `length` real; oldest first.
        length = np.minimum(h, state.length[uid] + rank)  # [count]
        cols = h + rank[:, None] - length[:, None] + np.arange(h)  # [count, H]
        real = np.arange(h) < length[:, None]
        index = np.where(real, uid[:, None] * width + cols, -1)
        heard = (
            (
                self.artist_of[pool_item.ravel()[np.maximum(index, 0)]]
                == self.artist_of[item][:, None]
            )
            & real
        ).any(1)
        liked_now = (liked[uid] == self.genre_of[item][:, None]).any(1)
        logit = 4.0 * liked_now + 0.3 * self.quality[item] + 0.6 * heard - 2.2
        chance = 1 / (1 + np.exp(-logit))
        label = (draw < chance).astype(np.int64)
        pool_action = np.zeros((users, width), np.int64)
        pool_action[:, :h] = state.action
        pool_action[uid, h + rank] = np.where(label == 1, LP_BIT, SKIP_BIT)

        tail = per_user[:, None] + np.arange(h)  # [users, H]: each user's newest H slots
        rows = np.arange(users)[:, None]
        after = StreamState(
            item=pool_item[rows, tail], time=pool_time[rows, tail],
            action=pool_action[rows, tail], length=np.minimum(h, state.length + per_user),
            liked=liked,
        )  # fmt: skip
        events = {
            "uid": uid, "time": time, "item": item, "organic": organic, "label": label,
            "chance": chance, "history_index": index,
            "history_pool": (pool_item.ravel(), pool_time.ravel(), pool_action.ravel()),
        }  # fmt: skip
        return events, after

    def days(self, first: int, last: int, count: int):
        """(day, events) for days [0, last) in order, events only from `first` on (earlier days
        are run for their state alone); each day `count` listens."""
        state = self.initial_state()
        for d in range(last):
            events, state = self.day(d, state, count)
            if d >= first:
                yield d, events

    def examples(self, events: dict) -> dict[str, np.ndarray]:
        """The model's inputs of a day's events (`input.parse_fn`'s output: histories oldest
        first, zero-padded after their length; the seven cross ids as `prepare.cross_ids`)."""
        index = events["history_index"]
        real = index >= 0
        safe = np.maximum(index, 0)
        pool_item, pool_time, pool_action = events["history_pool"]
        hist_item = np.where(real, pool_item[safe], 0)
        hist_time = np.where(real, pool_time[safe], 0)
        length = real.sum(1)
        item, uid, time = events["item"], events["uid"], events["time"]
        artist, album = self.artist_of[item], self.album_of[item]
        hour = (time // 3600) % 24
        keys = {"uid": uid, "artist_id": artist, "album_id": album, "hour_of_day": hour,
                "item_id": item, "is_organic": events["organic"]}  # fmt: skip
        crosses = [
            (xxh64_int64s(np.stack([keys[k] for k in names], 1)) % np.uint64(rows)).astype(np.int64)
            for names, rows in zip(CROSS_KEYS, self.cross_rows)
        ]
        last = np.take_along_axis(hist_time, np.maximum(length - 1, 0)[:, None], 1)[:, 0]
        return {
            "uih_item": hist_item.astype(np.int32),
            "uih_artist": np.where(real, self.artist_of[hist_item], 0).astype(np.int32),
            "uih_album": np.where(real, self.album_of[hist_item], 0).astype(np.int32),
            "uih_action": np.where(real, pool_action[safe], 0).astype(np.int32),
            "uih_time": hist_time,
            "uih_length": length.astype(np.int32),
            "contextual": np.stack([uid, *crosses], 1).astype(np.int32),
            "cand_item": item.astype(np.int32),
            "cand_artist": artist.astype(np.int32),
            "cand_album": album.astype(np.int32),
            "cand_time": np.where(length > 0, last, time),  # the last history event's time
            "label": events["label"].astype(np.float32),
        }
