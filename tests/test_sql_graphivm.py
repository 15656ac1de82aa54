"""GraphIVM's views (notes/graphivm.md) as SQL views: the worked example of the thesis, and the
experiment queries on a Twitter-like schema under tuple-at-a-time updates, where every
published diff equals the difference of two DuckDB results (publish-subscribe mode) and every
view equals DuckDB's result (warehouse mode), for every strategy."""

from __future__ import annotations

import random
from collections import Counter

import pandas as pd
import pytest
from sql_oracle import assert_same_rows, diff_counter, duckdb_results, multiset_difference

from ringml.sql import Database

# ------------------------------------------------------------------ the worked example
EXAMPLE = """
CREATE TABLE Users (username VARCHAR, gender VARCHAR, country VARCHAR);
CREATE TABLE Follower (username VARCHAR, followername VARCHAR);
CREATE TABLE Tweet (username VARCHAR, tweet VARCHAR, date DATE);
CREATE TABLE Retweet (retweet VARCHAR, username VARCHAR, tweet VARCHAR);
"""
RETWEET_TRACKER = """
SELECT U.username, U.gender, U.country, T.tweet, T.date, R.username AS retweeter
FROM Users U, Tweet T, Retweet R
WHERE U.username = T.username AND T.tweet = R.tweet
"""


def example_database() -> Database:
    """Figure 5.2a."""
    db = Database(EXAMPLE)
    db.insert(
        "Users",
        {
            "username": ["joe", "bob", "alice", "cathy"],
            "gender": ["male", "male", "female", "male"],
            "country": ["USA", "USA", "USA", "Canada"],
        },
    )
    db.insert(
        "Retweet",
        {
            "retweet": ["t2", "t3", "t4", "t6"],
            "username": ["bob", "bob", "alice", "bob"],
            "tweet": ["t1", "t1", "t1", "t3"],
        },
    )
    db.insert(
        "Follower",
        {"username": ["joe", "joe", "cathy"], "followername": ["bob", "alice", "bob"]},
    )
    db.insert(
        "Tweet",
        {"username": ["joe", "joe"], "tweet": ["t1", "t9"], "date": ["2015-02-02", "2015-02-03"]},
    )
    return db


@pytest.mark.parametrize("strategy", ["fivm", "first_order", "recompute", "higher_order"])
def test_retweet_tracker_worked_example(strategy):
    """Figure 5.2b, corrected (notes §2.2): bob twice, alice once; t9 has no retweet and
    t6 retweets t3, which is not a tweet."""
    db = example_database()
    view = db.create_view("RetweetTracker", RETWEET_TRACKER, strategy=strategy)
    rows = Counter(map(tuple, view.to_pandas().astype(str).to_numpy().tolist()))
    joe = ("joe", "male", "USA", "t1", "2015-02-02")
    assert rows == Counter({(*joe, "bob"): 2, (*joe, "alice"): 1})
    diffs = []
    view.subscribe(diffs.append)
    db.insert("Retweet", {"retweet": ["t7"], "username": ["cathy"], "tweet": ["t9"]})
    (diff,) = diffs
    assert diff.astype(str).to_numpy().tolist() == [
        ["joe", "male", "USA", "t9", "2015-02-03", "cathy", "1"]
    ]


def test_tweet_reach_counter_and_timeline():
    """Example 13 (COUNT per user: 3 retweets of joe's t1) and Example 17 (Timeline)."""
    db = example_database()
    counter = db.create_view(
        "TweetReachCounter",
        "SELECT U.username, count(R.tweet) FROM Users U, Tweet T, Retweet R "
        "WHERE U.username = T.username AND T.tweet = R.tweet GROUP BY U.username",
    )
    assert counter.to_pandas().values.tolist() == [["joe", 3]]
    timeline = db.create_view(
        "Timeline",
        "SELECT F.username, followername, tweet FROM Follower F, Tweet T "
        "WHERE F.username = T.username",
    )
    assert sorted(timeline.to_pandas().values.tolist()) == [
        ["joe", "alice", "t1"],
        ["joe", "alice", "t9"],
        ["joe", "bob", "t1"],
        ["joe", "bob", "t9"],
    ]
    diffs = []
    timeline.subscribe(diffs.append)
    db.insert("Tweet", {"username": ["joe"], "tweet": ["t10"], "date": ["2015-02-04"]})
    assert sorted(diffs[0].values.tolist()) == [
        ["joe", "alice", "t10", 1],
        ["joe", "bob", "t10", 1],
    ]


# ------------------------------------------------------------------ the experiment queries
TWITTER = """
CREATE TABLE Users (userId INTEGER, name VARCHAR, country VARCHAR);
CREATE TABLE Follower (userId INTEGER, followerId INTEGER);
CREATE TABLE Tweet (userId INTEGER, tweetId INTEGER, tweetDate DATE);
CREATE TABLE Retweet (userId INTEGER, tweetId INTEGER, tweetDate DATE, retweetTweetId INTEGER);
"""


def follower_chain(n: int, count: bool) -> str:
    """QJoinChainLengthFollower: n Follower aliases and Tweet, n joins (n = 1..4)."""
    joins = "".join(
        f" JOIN Follower F{i} ON F{i - 1}.userId = F{i}.followerId" for i in range(2, n + 1)
    )
    sql = f"FROM Follower F1{joins} JOIN Tweet T ON F{n}.userId = T.userId"
    if count:
        return f"SELECT F1.followerId, COUNT(*) AS tweets {sql} GROUP BY F1.followerId"
    return f"SELECT * {sql}"


VIEWS = {
    "Q1": "SELECT * FROM Users U JOIN Tweet T ON U.userId = T.userId",
    "Q2": "SELECT * FROM Follower F JOIN Tweet T ON F.userId = T.userId",
    "Q3": "SELECT * FROM Users U JOIN Tweet T ON U.userId = T.userId "
    "JOIN Retweet R ON T.tweetId = R.retweetTweetId",
    "Q1Agg": "SELECT U.userId, COUNT(T.tweetId) FROM Users U JOIN Tweet T ON U.userId = T.userId "
    "GROUP BY U.userId",
    "Q2Agg": "SELECT F.followerId, COUNT(T.tweetId) FROM Follower F JOIN Tweet T "
    "ON F.userId = T.userId GROUP BY F.followerId",
    "Q3Agg": "SELECT U.userId, COUNT(R.tweetId) FROM Users U JOIN Tweet T ON U.userId = T.userId "
    "JOIN Retweet R ON T.tweetId = R.retweetTweetId GROUP BY U.userId",
    "RetweetTracker": "SELECT U.userId, U.name, U.country, T.tweetId, T.tweetDate, "
    "R.userId AS retweeter FROM Users U, Tweet T, Retweet R "
    "WHERE U.userId = T.userId AND T.tweetId = R.retweetTweetId",
    "TweetReach": "SELECT T.userId, T.tweetId, F.followerId FROM Tweet T, Retweet R1, "
    "Retweet R2, Follower F WHERE T.tweetId = R1.retweetTweetId "
    "AND R1.retweetTweetId = R2.retweetTweetId AND R2.userId = F.userId",
    "Timeline": "SELECT F.followerId, T.tweetId, T.tweetDate FROM Follower F, Tweet T "
    "WHERE F.userId = T.userId AND T.tweetDate >= DATE '2015-01-02'",
    "RetweetChain": "SELECT R1.tweetId, F.followerId FROM Retweet R1 "
    "JOIN Retweet R2 ON R1.tweetId = R2.retweetTweetId JOIN Follower F ON R2.userId = F.userId",
    **{f"Chain{n}": follower_chain(n, False) for n in range(1, 5)},
    **{f"Chain{n}Count": follower_chain(n, True) for n in range(1, 5)},
}
STRATEGIES = ("fivm", "first_order", "recompute", "higher_order")
USERS = list(range(6))
DATES = [pd.Timestamp(d) for d in ("2015-01-01", "2015-01-02", "2015-01-03")]


def random_row(rng: random.Random, table: str, next_id: list[int]) -> tuple:
    if table == "Users":
        return (rng.choice(USERS), rng.choice(["ann", "bo"]), rng.choice(["US", "CA"]))
    if table == "Follower":
        return (rng.choice(USERS), rng.choice(USERS))
    next_id[0] += 1
    if table == "Tweet":
        return (rng.choice(USERS), rng.choice(range(8)), rng.choice(DATES))
    return (rng.choice(USERS), 100 + next_id[0], rng.choice(DATES), rng.choice(range(8)))


COLUMNS = {
    "Users": ["userId", "name", "country"],
    "Follower": ["userId", "followerId"],
    "Tweet": ["userId", "tweetId", "tweetDate"],
    "Retweet": ["userId", "tweetId", "tweetDate", "retweetTweetId"],
}


def frame(table: str, rows) -> pd.DataFrame:
    out = pd.DataFrame(list(rows), columns=COLUMNS[table])
    for column in out.columns:
        if column == "tweetDate":
            out[column] = pd.to_datetime(out[column]).astype("datetime64[ns]")
        elif column not in ("name", "country"):
            out[column] = out[column].astype("int64")
    return out


@pytest.mark.parametrize("seed, steps", [(0, 16), pytest.param(1, 60, marks=pytest.mark.slow)])
def test_experiment_views_tuple_at_a_time(seed, steps):
    """Single-tuple inserts and deletes into every table: after each, every view equals
    DuckDB, and the fivm database's diff equals DuckDB(after) - DuckDB(before)."""
    rng = random.Random(seed)
    next_id = [0]
    sizes = {"Users": 5, "Follower": 9, "Tweet": 8, "Retweet": 8}
    tables = {t: [random_row(rng, t, next_id) for _ in range(n)] for t, n in sizes.items()}
    databases = {}
    for strategy in STRATEGIES:
        db = Database(TWITTER)
        for table, rows in tables.items():
            db.insert(table, frame(table, rows))
        for name, sql in VIEWS.items():
            db.create_view(name, sql, strategy=strategy)
        databases[strategy] = db
    published = {name: [] for name in VIEWS}
    for name in VIEWS:
        databases["fivm"].view(name).subscribe(published[name].append)

    def oracle():
        return duckdb_results(VIEWS, {t: frame(t, rows) for t, rows in tables.items()})

    before = oracle()
    for step in range(steps):
        table = rng.choice(list(COLUMNS))
        delete = bool(tables[table]) and rng.random() < 0.45
        if delete:
            row = rng.choice(tables[table])
            tables[table].remove(row)
            for db in databases.values():
                db.delete(table, frame(table, [row]))
        else:
            row = random_row(rng, table, next_id)
            tables[table].append(row)
            for db in databases.values():
                db.insert(table, frame(table, [row]))
        after = oracle()
        what = f"step {step}: {'delete' if delete else 'insert'} {table} {row}"
        for name in VIEWS:
            for strategy, db in databases.items():
                assert_same_rows(
                    db.view(name).to_pandas(), after[name], f"{what}, {name}, {strategy}"
                )
            got = Counter()
            for diff in published[name]:
                got.update(diff_counter(diff))
            got = Counter({k: v for k, v in got.items() if v})
            assert got == multiset_difference(before[name], after[name]), f"{what}, {name}"
            published[name].clear()
        before = after


def test_chain_views_compile_to_one_atom_per_alias():
    db = Database(TWITTER)
    view = db.create_view("c4", follower_chain(4, True))
    assert [a.alias for a in view.plan.atoms] == ["F1", "F2", "F3", "F4", "T"]
    assert {a.table for a in view.plan.atoms} == {"Follower", "Tweet"}
    assert [v for v, _ in view.plan.keys] == ["F1.followerId"]
