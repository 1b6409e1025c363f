//! Memory's signals, handled apart from the conversation pipeline: `<prefix>.signal.memory.<user>.<bot>`
//! runs that user's extraction with that companion ([`super::extract`]); `message_deleted`,
//! `memory_cleared` and `user_erased` run a deletion ([`super::erase`]). Each is a journaled job of its
//! own.

use std::sync::Arc;

use bson::oid::ObjectId;

use super::{KIND, Memory, MemoryError, extract::Extractor};
use crate::{
    bus::{Bus, event::parse_object_id},
    character::Characters,
    journal::Journal,
    llm::LlmClient,
    spend::SpendGuard,
};

/// What memory's signals need, owned.
pub struct MemorySignals {
    pub memory: Memory,
    pub journal: Journal,
    pub llm: LlmClient,
    pub bus: Bus,
    /// The companions: an extraction's prompts name the one the user talked to.
    pub characters: Characters,
    /// The model extraction and summaries use (the cheaper one).
    pub model: String,
    /// `COMPANION_HISTORY_LIMIT`: what has left it goes into the summary.
    pub history_limit: i64,
    /// Extraction is paid by the service and waits while its budget is used up.
    pub spend: Arc<SpendGuard>,
}

impl MemorySignals {
    /// An extraction signal (`kind` [`KIND`], `id` `<userId>.<botId>`, its body unused): what the user
    /// said since the last extraction.
    pub async fn extraction(&self, kind: &str, id: &str) -> Result<(), MemoryError> {
        if kind != KIND {
            return Err(MemoryError::Invalid(format!(
                "`{kind}` is a deletion signal: MemorySignals::deletion"
            )));
        }
        let (user, bot) = id
            .split_once('.')
            .filter(|(u, b)| [u, b].iter().all(|i| parse_object_id(i).is_some()))
            .ok_or_else(|| MemoryError::Invalid(format!("`{id}` is not <userId>.<botId>")))?;
        let Some(character) = ObjectId::parse_str(bot)
            .ok()
            .and_then(|b| self.characters.by_bot(&b))
        else {
            return Err(MemoryError::Invalid(format!("no character for bot {bot}")));
        };
        if !self.memory.config.enabled {
            return Ok(());
        }
        let extractor = Extractor {
            memory: &self.memory,
            journal: &self.journal,
            llm: &self.llm,
            bus: &self.bus,
            model: &self.model,
            history_limit: self.history_limit,
            companion: &character.name,
            spend: Some(&self.spend),
        };
        extractor.extract(user, bot).await?;
        Ok(())
    }

    /// A deletion signal (`message_deleted`, `memory_cleared`, `user_erased`) about `id`, the signal
    /// stream's message `seq` ([`Memory::on_signal`]).
    pub async fn deletion(
        &self,
        kind: &str,
        id: &str,
        payload: &[u8],
        seq: u64,
    ) -> Result<(), MemoryError> {
        self.memory
            .on_signal(&self.journal, &self.bus, kind, id, payload, seq)
            .await?;
        Ok(())
    }
}
