"""A worker over the inbox table of `outboxd inbox` (sql/08_inbox.sql), in Python.

Claims rows in order per key, applies each in the same transaction, marks them done and commits;
run as many as you like. A crash before COMMIT rolls back the effect and the mark together, and
the rows are claimed again.

    pip install "psycopg[binary]>=3.1"
    python3 examples/inbox/worker.py "host=localhost dbname=billing user=billing"
"""

import sys
import time

import psycopg


def apply(cur, row):
    """The business effect of one event; replace with your own (same cursor, same transaction)."""
    seq, event_id, key, event_type, payload = row
    print(seq, event_id, key, event_type, payload, flush=True)
    cur.execute(
        "INSERT INTO inbox_demo_effects (seq, event_id) VALUES (%s, %s)", (seq, event_id)
    )


def main(url):
    with psycopg.connect(url) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS inbox_demo_effects (seq bigint PRIMARY KEY, event_id text)"
        )
        conn.commit()
        while True:
            with conn.transaction():
                cur = conn.cursor()
                rows = cur.execute(
                    "SELECT seq, event_id, aggregate_key, event_type, payload_json"
                    " FROM public.inbox_claim(10)"
                ).fetchall()
                for row in rows:
                    apply(cur, row)
                if rows:
                    cur.execute("SELECT public.inbox_done(%s)", ([r[0] for r in rows],))
            if not rows:
                time.sleep(0.2)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: worker.py POSTGRES_URL")
    main(sys.argv[1])
