-- When a fact's newest source message was said: a fact learned late from an older message (an extraction
-- that ran after a newer "remember") never replaces the newer value.
ALTER TABLE memory_facts ADD COLUMN IF NOT EXISTS said_at TIMESTAMPTZ NOT NULL DEFAULT now();
