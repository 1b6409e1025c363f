//! What a step is: its persisted name, the type of its record and how `companion explain` tells it, in one
//! definition ([`StepKind`]) that the stage recording the step owns, next to its record. The writer
//! ([`crate::Job::step`]), the replay ([`crate::Job::recorded`]) and the story's reader ([`Tell`]) all go
//! through it, so a name can no longer be written with one type and read back as another.
//!
//! The journal knows none of the records: it stores what a kind gives it and hands it back as that kind.

use std::{collections::HashMap, marker::PhantomData};

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

/// One kind of step whose record is a `T`.
pub struct StepKind<T> {
    /// The persisted name (`job_steps.name`): never changed once a journal holds it, or old journals no
    /// longer read.
    pub name: &'static str,
    /// Its lazy records may share one packed row ([`crate::names::PACKED`]): a few bytes that hold no
    /// user's words, move no counter and no tally, and that no statement selects by name.
    pub(crate) packable: bool,
    /// The step in words and in fields, for `companion explain`.
    tell: Tells<T>,
    record: PhantomData<fn() -> T>,
}

/// How a kind is told.
enum Tells<T> {
    /// By its name alone.
    Name,
    /// Without its record (what it did is all there is to say).
    Says(fn(&Told<'_>) -> Telling),
    /// From its record.
    Record(fn(&Told<'_>, &T) -> Telling),
}

impl<T> Clone for Tells<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Tells<T> {}

/// What [`StepKind`]'s telling gives: the step in words, and the same for machines.
pub type Telling = (String, Value);

impl<T> Clone for StepKind<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for StepKind<T> {}

impl<T> StepKind<T> {
    /// Step `name`, told by its name alone (`memory_batch` is "memory batch").
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            packable: false,
            tell: Tells::Name,
            record: PhantomData,
        }
    }

    /// Told from its record by `tell`.
    pub const fn told(mut self, tell: fn(&Told<'_>, &T) -> Telling) -> Self {
        self.tell = Tells::Record(tell);
        self
    }

    /// Told by `says`, whatever its record holds.
    pub const fn says(mut self, says: fn(&Told<'_>) -> Telling) -> Self {
        self.tell = Tells::Says(says);
        self
    }

    /// Its lazy records are packed ([`StepKind::packable`]).
    pub const fn packed(mut self) -> Self {
        self.packable = true;
        self
    }
}

/// What a telling may read besides the record.
#[derive(Clone, Copy, Debug)]
pub struct Told<'a> {
    /// The step's key.
    pub key: &'a str,
    /// The job the step belongs to.
    pub job: &'a str,
    /// The tally it counted under, if any.
    pub tally: Option<&'a str>,
    /// Companions' names by id, from the character files.
    pub names: &'a HashMap<String, String>,
}

/// A companion by name, where the character files know it (`names`, by id); else by id.
pub fn companion_name(names: &HashMap<String, String>, bot: &str) -> String {
    names.get(bot).cloned().unwrap_or_else(|| bot.to_owned())
}

impl Told<'_> {
    /// A companion by name, where the character files know it; else by id.
    pub fn name(&self, bot: &str) -> String {
        companion_name(self.names, bot)
    }
}

/// A value as text, or "unknown" (a figure an older record lacks), as the tellers say it.
pub fn or_unknown<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "unknown".into(), |v| v.to_string())
}

/// A step kind with its record type forgotten: what the story's reader lists.
pub trait Tell: Sync {
    fn name(&self) -> &'static str;

    /// Whether its lazy records are packed ([`StepKind::packed`]).
    fn packable(&self) -> bool;

    /// Whether `output` reads as the kind's record, as a replay reads it ([`crate::Job::recorded`]).
    fn reads(&self, output: &Value) -> bool;

    /// `output` in words and in fields; none when it does not read as the kind's record.
    fn tell(&self, told: &Told<'_>, output: &Value) -> Option<Telling>;
}

impl<T: DeserializeOwned> Tell for StepKind<T> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn packable(&self) -> bool {
        self.packable
    }

    fn reads(&self, output: &Value) -> bool {
        T::deserialize(output).is_ok()
    }

    fn tell(&self, told: &Told<'_>, output: &Value) -> Option<Telling> {
        match self.tell {
            Tells::Name => Some((self.name.replace('_', " "), json!({}))),
            Tells::Says(says) => Some(says(told)),
            Tells::Record(tell) => {
                let record = T::deserialize(output).ok()?;
                Some(tell(told, &record))
            }
        }
    }
}

/// The record of a counted step ([`crate::Job::counted`]): the tally it counted under.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Counted {
    /// The tally (none: a record the migration of the earlier journal's write ledger wrote, which
    /// names the tool instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted: Option<String>,
}
