-- Reminders a companion promised (`schedule_reminder`): the timer itself is a JetStream message schedule
-- (`<prefix>.schedule.reminder.<id>` fires `<prefix>.signal.reminder.<id>`); this row is what the user
-- asked for and where it stands, for the prompt's list, the per-user bound and cancelling.
CREATE TABLE IF NOT EXISTS reminders (
    -- Derived from the turn's message and the tool call: a retried call makes the same reminder.
    id              TEXT        PRIMARY KEY,
    user_id         TEXT        NOT NULL,
    bot_id          TEXT        NOT NULL,
    conversation_id TEXT        NOT NULL,
    text            TEXT        NOT NULL,
    -- The time the user asked for, and when it fires (held to 07:00 local out of quiet hours).
    due_at          TIMESTAMPTZ NOT NULL,
    fire_at         TIMESTAMPTZ NOT NULL,
    state           TEXT        NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'cancelled', 'sent', 'dropped')),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS reminders_pending ON reminders (user_id, bot_id, fire_at) WHERE state = 'pending';
