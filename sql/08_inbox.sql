-- 08_inbox.sql — the consumer's side: the inbox table `outboxd inbox` writes, the offsets it
-- keeps beside it, and the functions a worker claims and finishes rows with.
--
-- `outboxd inbox` applies this file itself when the table is missing, with `public.inbox`
-- replaced by --inbox-table and every `inbox_` name prefixed by that table's name instead, so
-- two inbox tables in one database do not collide. Applying it by hand (psql -f) makes
-- public.inbox. Safe to run more than once.
--
-- What each part guarantees (docs/src/inbox.md has the whole pattern):
--   * event_id is unique: a record seen twice (a redelivery, a retry of the producer, two
--     consumers during a rebalance) is inserted once (`ON CONFLICT (event_id) DO NOTHING`).
--   * seq is the order of arrival; rows of one aggregate_key (the Kafka key, one partition)
--     arrive in their partition's order, so seq orders each key.
--   * inbox_offsets holds, per consumer group and partition, the next offset to read. It is
--     written in the same transaction as the rows, and `outboxd inbox` starts every partition
--     there, never at the group's Kafka offsets (`--start-from committed` reads those once, for
--     a partition with no row here, and stores them here first): a crash at any instant loses
--     no row and doubles none.

CREATE TABLE IF NOT EXISTS public.inbox (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The `id` header, else the --event-id-header header, else 'TOPIC/PARTITION/OFFSET'.
    event_id        text        NOT NULL UNIQUE,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    -- The record key as text (invalid UTF-8 replaced); the claim orders rows per value.
    aggregate_key   text,
    -- The record key's bytes as they were.
    key             bytea,
    -- The --event-type-header header (eventType), when the record has it.
    event_type      text,
    -- The value's bytes as they were; NULL for a tombstone.
    payload         bytea,
    -- The value as jsonb when it is a JSON document jsonb takes, else NULL.
    payload_json    jsonb,
    -- Every header: name -> text (invalid UTF-8 replaced), or null for a header without value.
    headers         jsonb       NOT NULL DEFAULT '{}',
    kafka_timestamp timestamptz,
    received_at     timestamptz NOT NULL DEFAULT now(),
    processed_at    timestamptz
);

-- The claim's path: the unprocessed rows of each key in order.
CREATE INDEX IF NOT EXISTS inbox_unprocessed_idx
    ON public.inbox (aggregate_key, seq) WHERE processed_at IS NULL;
-- The oldest unprocessed row (the backlog's age) and the claim's scan.
CREATE INDEX IF NOT EXISTS inbox_unprocessed_seq_idx
    ON public.inbox (seq) WHERE processed_at IS NULL;

CREATE TABLE IF NOT EXISTS public.inbox_offsets (
    group_id        text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    -- The offset of the next record to read (one past the last one stored).
    next_offset     bigint      NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, kafka_partition)
);

-- Claim up to max_rows rows to process, in order per aggregate_key, inside the caller's
-- transaction:
--
--   BEGIN;
--   SELECT * FROM public.inbox_claim(10);
--   -- apply each row's effect in the same transaction, then:
--   SELECT public.inbox_done(ARRAY[seq, ...]);
--   COMMIT;
--
-- Only the head of each key (its unprocessed row with the lowest seq) is handed out, locked
-- FOR UPDATE SKIP LOCKED: a key whose head another worker holds is skipped, so N workers run in
-- parallel and no key's rows are processed out of order or twice. A worker that dies rolls back
-- and its rows are handed out again. Rows without a key are independent of each other.
CREATE OR REPLACE FUNCTION public.inbox_claim(max_rows integer DEFAULT 10)
RETURNS SETOF public.inbox
LANGUAGE sql VOLATILE AS $$
    SELECT i.*
      FROM public.inbox i
     WHERE i.processed_at IS NULL
       AND (i.aggregate_key IS NULL OR NOT EXISTS (
             SELECT 1 FROM public.inbox e
              WHERE e.aggregate_key = i.aggregate_key
                AND e.processed_at IS NULL
                AND e.seq < i.seq))
     ORDER BY i.seq
     LIMIT max_rows
       FOR UPDATE SKIP LOCKED
$$;

-- Mark claimed rows processed (in the worker's transaction, before its COMMIT).
CREATE OR REPLACE FUNCTION public.inbox_done(seqs bigint[])
RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH done AS (
        UPDATE public.inbox SET processed_at = now()
         WHERE seq = ANY (seqs) AND processed_at IS NULL
        RETURNING 1)
    SELECT count(*)::integer FROM done
$$;

-- Retention: delete up to max_rows processed rows that were processed more than `retain` ago
-- and received more than `dedupe_window` ago; returns how many went. A row stays at least
-- dedupe_window after it arrived, so a late duplicate of its event (a producer's retry, a
-- replay) still finds the id and is not inserted, and processed, again. `outboxd inbox
-- --retain` calls it every minute, in rounds of 10000 rows; unprocessed rows are never deleted.
CREATE OR REPLACE FUNCTION public.inbox_prune(retain interval, dedupe_window interval,
                                              max_rows integer DEFAULT 10000)
RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH gone AS (
        DELETE FROM public.inbox
         WHERE seq IN (SELECT seq FROM public.inbox
                        WHERE processed_at < now() - retain
                          AND received_at < now() - dedupe_window
                        ORDER BY seq
                        LIMIT max_rows)
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;
