-- 06_emit.sql — outbox_emit(): an outbox without a table, through logical messages.
--
-- Instead of inserting an outbox row, the application calls
--
--     SELECT outbox_emit('order', '42', 'order.paid.v1', '{"orderId": "42"}', '{"traceparent": "00-..."}');
--
-- in the SAME transaction as its business change. It writes a transactional logical decoding
-- message with prefix 'outbox' (pg_logical_emit_message(true, ...)) holding the event as a JSON
-- object: it reaches the slot only if the transaction commits, and leaves nothing behind in any
-- table (no bloat, no VACUUM, nothing to delete). Run outboxd with `--messages-prefix outbox`
-- (PostgreSQL 14 or later; wal_level = logical). It returns the event id.
--
-- The object's keys are our default routing columns (event_id, aggregate_type, aggregate_id,
-- event_type, payload, headers, created_at); with other --table-field-* flags, emit your own object
-- with pg_logical_emit_message(true, 'outbox', <json>) using the names those flags give.
--
-- Trade-off: nothing is kept. There is nothing to poll, to backfill (`outboxd backfill` reads the
-- outbox table) or to inspect later; once the slot has confirmed a message, only the sink has it.
--
-- Safe to run more than once.

CREATE OR REPLACE FUNCTION public.outbox_emit(
    aggregate_type text,
    aggregate_id   text,
    event_type     text,
    payload        jsonb,
    headers        jsonb DEFAULT '{}'::jsonb
) RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    id uuid := gen_random_uuid();
BEGIN
    PERFORM pg_catalog.pg_logical_emit_message(
        true,
        'outbox',
        pg_catalog.jsonb_build_object(
            'event_id',       id,
            'aggregate_type', aggregate_type,
            'aggregate_id',   aggregate_id,
            'event_type',     event_type,
            'payload',        payload,
            'headers',        coalesce(headers, '{}'::jsonb),
            -- The transaction's start, as the outbox table's DEFAULT now() gives it; RFC 3339.
            'created_at',     pg_catalog.now()
        )::text
    );
    RETURN id;
END
$fn$;

COMMENT ON FUNCTION public.outbox_emit(text, text, text, jsonb, jsonb) IS
    'Emit an outbox event as a transactional logical message (prefix outbox) for outboxd --messages-prefix outbox; returns its event_id.';
