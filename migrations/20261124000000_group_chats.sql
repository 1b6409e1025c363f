-- Group conversations: their history is one window per conversation (every companion of the group sees
-- it), kept apart from the DM windows of each user and companion.
ALTER TABLE bot_conversations ADD COLUMN IF NOT EXISTS group_chat boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS bot_conversations_group_window
    ON bot_conversations (conversation_id, created_at DESC, id DESC) WHERE group_chat;
