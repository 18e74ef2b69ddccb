-- 02_orders_example.sql — an example producer of outbox events.
--
-- A small `orders` table whose trigger records an `order.paid.v1` event in
-- public.outbox whenever an order moves into the 'paid' state.  Because the
-- trigger runs inside the updating transaction, the event exists if and only
-- if the status change commits.  Requires 01_outbox.sql.
--
-- Safe to run more than once (CREATE OR REPLACE TRIGGER needs PostgreSQL 14+).

CREATE TABLE IF NOT EXISTS public.orders (
    id           bigserial     PRIMARY KEY,
    user_id      bigint        NOT NULL,
    status       text          NOT NULL DEFAULT 'created'
                 CONSTRAINT orders_status_check
                 CHECK (status IN ('created', 'paid', 'shipped', 'canceled')),
    total_amount numeric(12,2) NOT NULL DEFAULT 0,
    paid_at      timestamptz,
    created_at   timestamptz   NOT NULL DEFAULT now(),
    updated_at   timestamptz   NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION public.orders_emit_paid_event()
RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_paid_at timestamptz;
BEGIN
    -- Only the edge into 'paid' counts; re-saving a paid order emits nothing.
    IF NEW.status IS DISTINCT FROM 'paid' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.status IS NOT DISTINCT FROM 'paid' THEN
        RETURN NEW;
    END IF;

    v_paid_at := COALESCE(NEW.paid_at, now());

    INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
    VALUES (
        'order',
        NEW.id::text,
        'order.paid.v1',
        jsonb_build_object(
            'order_id',     NEW.id,
            'user_id',      NEW.user_id,
            'total_amount', NEW.total_amount,
            'paid_at',      v_paid_at
        ),
        jsonb_build_object(
            -- a fresh trace id unless the application put one in the session
            'trace_id', COALESCE(NULLIF(current_setting('app.trace_id', true), ''),
                                 replace(gen_random_uuid()::text, '-', '')),
            'source',   'db-trigger:orders'
        )
    );

    RETURN NEW;
END;
$fn$;

-- BEFORE trigger so the row can be normalised (paid_at / updated_at) in one place.
CREATE OR REPLACE FUNCTION public.orders_touch()
RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    NEW.updated_at := now();
    IF NEW.status = 'paid' AND NEW.paid_at IS NULL THEN
        NEW.paid_at := now();
    END IF;
    RETURN NEW;
END;
$fn$;

CREATE OR REPLACE TRIGGER orders_touch_trg
    BEFORE INSERT OR UPDATE ON public.orders
    FOR EACH ROW
    EXECUTE FUNCTION public.orders_touch();

CREATE OR REPLACE TRIGGER orders_paid_outbox_trg
    AFTER INSERT OR UPDATE OF status ON public.orders
    FOR EACH ROW
    EXECUTE FUNCTION public.orders_emit_paid_event();
