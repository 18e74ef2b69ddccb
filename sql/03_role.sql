-- 03_role.sql — a least-privilege login role for the outboxd relay.
--
-- outboxd needs to: log in, open a replication connection (REPLICATION),
-- create/use its logical replication slot, and read public.outbox (the
-- initial table lookup and any snapshot/catch-up queries).  It does NOT need
-- to own the table or be a superuser.
--
-- Creating a publication FOR TABLE requires ownership of that table, so the
-- publication is created by the table owner in 04_publication.sql and the
-- relay only consumes it.
--
-- Password: pass it as a psql variable, e.g.
--     psql -v relay_password='change-me' -f sql/03_role.sql
-- If the variable is not set the role is created WITHOUT a password (it can
-- then only log in via trust/peer/cert auth) — set one before use:
--     ALTER ROLE outboxd_relay PASSWORD '...';
--
-- Safe to run more than once.

DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'outboxd_relay') THEN
        CREATE ROLE outboxd_relay LOGIN REPLICATION;
    ELSE
        ALTER ROLE outboxd_relay LOGIN REPLICATION;
    END IF;
END
$do$;

-- Set the password only when the operator supplied one (psql \if needs psql >= 10).
\if :{?relay_password}
ALTER ROLE outboxd_relay PASSWORD :'relay_password';
\endif

GRANT USAGE ON SCHEMA public TO outboxd_relay;
GRANT SELECT ON public.outbox TO outboxd_relay;
