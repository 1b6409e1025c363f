//! Which tools a turn is offered. Every tool definition the model is sent costs prompt tokens on every
//! call of the turn, so a turn is offered the groups its messages call for: read from the new messages
//! and the companion's last message (a "yes please" answers it), in the languages the crisis screen
//! knows, plus what the user's state makes relevant (a running flow, pending reminders); small talk keeps
//! the offer of the conversation's last ask ([`Offer::or_earlier`]). A guess that falls short costs one
//! round: the model asks [`super::more_tools`] for the group.
//!
//! An offer is one of a few dozen sets, each with its own definitions built once, so requests with the
//! same offer share a prefix a provider can cache.

use super::Group;

/// How many offers there are (one per set of groups).
pub(crate) const OFFERS: usize = 1 << Group::ALL.len();

/// The groups offered to one turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offer(u8);

impl Offer {
    /// Every group (no `more_tools`).
    pub const fn all() -> Self {
        Self((OFFERS - 1) as u8)
    }

    pub const fn none() -> Self {
        Self(0)
    }

    /// This offer, or, when it offers nothing (small talk: "lol", "thanks!"), the first of `earlier`
    /// (the offers of the conversation's earlier messages, newest first) that offers something. A run
    /// of small talk then keeps the offer, and with it the prefix (the tools come first), of the turn
    /// that last asked for something, which a provider's prompt cache serves.
    pub fn or_earlier<I: Iterator<Item = Offer>>(self, earlier: impl FnOnce() -> I) -> Self {
        match self == Self::none() {
            true => earlier().find(|o| *o != Self::none()).unwrap_or(self),
            false => self,
        }
    }

    pub fn with(self, g: Group) -> Self {
        Self(self.0 | g.bit())
    }

    pub fn has(self, g: Group) -> bool {
        self.0 & g.bit() != 0
    }

    pub(crate) fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// What a turn's offer is read from.
#[derive(Clone, Debug, Default)]
pub struct Signals<'a> {
    /// The messages answered now, and the companion's last message before them.
    pub texts: Vec<&'a str>,
    /// The user has reminders pending with this companion (one may be cancelled).
    pub pending_reminders: bool,
    /// The user is in a guided flow with this companion.
    pub in_flow: bool,
    /// The companion offers guided flows.
    pub has_flows: bool,
}

/// Words that call for a group: lowercase, matched anywhere in the lowercased text (so stems work and
/// Japanese needs no word breaks). A false match costs a few hundred tokens, a missed one a round.
const TRICKS: &[&str] = &[
    "trick",
    "list",
    "learn",
    "landed",
    "land ",
    "nailed",
    "stomped",
    "progress",
    "teach",
    "how do i",
    "how to",
    "ollie",
    "flip",
    "grind",
    "slide",
    "manual",
    "grab",
    "spin",
    "180",
    "360",
    "540",
    "720",
    "air",
    "drop in",
    "rail",
    "box",
    "jump",
    "kicker",
    "butter",
    "carve",
    "switch",
    "fakie",
    "nollie",
    "boneless",
    "stall",
    "bunny hop",
    "bunnyhop",
    "barspin",
    "tailwhip",
    "wheelie",
    "truco",
    "manobra",
    "aprender",
    "apprendre",
    "figure",
    "lernen",
    "トリック",
    "技",
    "練習",
    "ステップ",
];
/// Changing the user's lists: making one, checking a trick off.
const LISTS: &[&str] = &[
    "list",
    "landed",
    "nailed",
    "stomped",
    "finally",
    "my first",
    "check off",
    "tick off",
    "lista",
    "liste",
    "logré",
    "consegui",
    "réussi",
    "geschafft",
    "リスト",
    "できた",
    "決めた",
];
const SPOTS: &[&str] = &[
    "spot",
    "park",
    "where",
    "near",
    "map",
    "goo.gl",
    "maps.app",
    "apple.co",
    "ledge",
    "stairs",
    "diy",
    "resort",
    "mountain",
    "plaza",
    "bowl",
    "halfpipe",
    "half pipe",
    "ramp",
    "location",
    "pista",
    "parque",
    "donde",
    "dónde",
    "onde",
    "où",
    "pico",
    "スポット",
    "パーク",
    "どこ",
    "近く",
];
const REMINDERS: &[&str] = &[
    "remind",
    "reminder",
    "don't let me forget",
    "dont let me forget",
    "alarm",
    "ping me",
    "nudge me",
    "tomorrow",
    "tonight",
    "later",
    "at 5",
    "o'clock",
    "weekend",
    "saturday",
    "sunday",
    "monday",
    "recuérdame",
    "recuerdame",
    "recordatorio",
    "lembra",
    "lembre",
    "rappelle",
    "erinner",
    "リマインド",
    "思い出させ",
    "明日",
];
const CANCEL: &[&str] = &[
    "cancel",
    "never mind",
    "nevermind",
    "don't remind",
    "dont remind",
    "forget it",
    "cancela",
    "annule",
    "キャンセル",
];
const MEMORY: &[&str] = &[
    "remember",
    "forget",
    "keep in mind",
    "don't tell",
    "what do you know about me",
    "recuerda",
    "acuérdate",
    "acuerdate",
    "olvida",
    "lembre-se",
    "lembra de",
    "esqueça",
    "esquece",
    "souviens",
    "oublie",
    "覚えて",
    "忘れて",
];
const FLOWS: &[&str] = &[
    "plan",
    "season",
    "coach",
    "teach me",
    "step by step",
    "progression",
    "add a spot",
    "new spot",
    "submit",
    "temporada",
    "saison",
    "シーズン",
    "計画",
];

fn any(texts: &[String], words: &[&str]) -> bool {
    texts.iter().any(|t| words.iter().any(|w| t.contains(w)))
}

/// The offer for a turn with `signals`.
pub fn for_turn(signals: &Signals<'_>) -> Offer {
    let texts: Vec<String> = signals.texts.iter().map(|t| t.to_lowercase()).collect();
    let mut offer = Offer::none();
    if any(&texts, TRICKS) {
        offer = offer.with(Group::Tricks);
    }
    if any(&texts, LISTS) {
        offer = offer.with(Group::Lists);
    }
    if any(&texts, SPOTS) || texts.iter().any(|t| t.contains("http")) {
        offer = offer.with(Group::Spots);
    }
    if any(&texts, REMINDERS) || (signals.pending_reminders && any(&texts, CANCEL)) {
        offer = offer.with(Group::Reminders);
    }
    if signals.has_flows && any(&texts, FLOWS) {
        offer = offer.with(Group::Flows);
    }
    if signals.in_flow {
        offer = offer.with(Group::InFlow);
    }
    if any(&texts, MEMORY) {
        offer = offer.with(Group::Memory);
    }
    offer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(text: &str) -> Offer {
        for_turn(&Signals {
            texts: vec![text],
            has_flows: true,
            ..Default::default()
        })
    }

    #[test]
    fn an_offer_of_nothing_takes_the_newest_earlier_one_that_offers_something() {
        let tricks = Offer::none().with(Group::Tricks);
        let spots = Offer::none().with(Group::Spots);
        let earlier = || [Offer::none(), spots, tricks].into_iter();
        assert_eq!(Offer::none().or_earlier(earlier), spots);
        assert_eq!(tricks.or_earlier(earlier), tricks);
        assert_eq!(
            Offer::none().or_earlier(|| [Offer::none()].into_iter()),
            Offer::none()
        );
    }

    #[test]
    fn small_talk_is_offered_nothing_and_asks_are_offered_their_group() {
        assert_eq!(offer("hey whats up"), Offer::none());
        assert!(offer("how do i land a kickflip").has(Group::Tricks));
        assert!(
            !offer("how do i land a kickflip").has(Group::Lists),
            "a how-to changes no list"
        );
        assert!(offer("i finally landed it!!").has(Group::Lists));
        assert!(offer("make me a list for the park").has(Group::Lists));
        assert!(offer("any good skateparks near me?").has(Group::Spots));
        assert!(offer("remind me to wax my board tomorrow").has(Group::Reminders));
        assert!(offer("help me plan my season").has(Group::Flows));
        assert!(offer("明日リマインドして").has(Group::Reminders));
    }

    #[test]
    fn state_adds_groups() {
        let s = Signals {
            texts: vec!["ok cancel that"],
            pending_reminders: true,
            in_flow: true,
            ..Default::default()
        };
        let o = for_turn(&s);
        assert!(o.has(Group::Reminders) && o.has(Group::InFlow));
        assert!(
            !o.has(Group::Flows),
            "no flows to start without the companion's flows"
        );
    }

    impl Offer {
        fn groups(self) -> Vec<Group> {
            Group::ALL.into_iter().filter(|g| self.has(*g)).collect()
        }
    }

    #[test]
    fn offers_index_their_own_definitions() {
        assert_eq!(Offer::all().index(), OFFERS - 1);
        assert_eq!(Offer::all().groups().len(), Group::ALL.len());
        assert_eq!(Offer::none().with(Group::Spots).groups(), [Group::Spots]);
    }
}
