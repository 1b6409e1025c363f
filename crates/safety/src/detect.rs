//! The crisis decision on one user message, from its layers (docs/safety.md):
//! - the rules ([`super::screen`]): local, microseconds, in the six covered languages; a sure match
//!   refers on its own;
//! - the learned layer ([`super::learned`]): hashed n-grams and the message's embedding, for what
//!   nobody wrote a rule for;
//! - the moderation endpoint, when one is configured (its categories mapped to ours here);
//! - the reply model's own flag, raised later in the turn (layer [`Layer::Model`]).
//!
//! [`CrisisScreen`] owns the decision.
//!
//! Any layer's flag refers, unless the sport-language exclusions apply to the message (the slang was
//! masked out and no crisis word is left). A sure rule refers unless the learned layer is confident the
//! whole message is no crisis (its model's `veto`, chosen on the tuning lines).

use serde::{Deserialize, Serialize};

use super::{
    learned,
    screen::{self, Blocked, Category},
};

/// The learned layer's score (1 − p(none)) that confirms an unsure rule.
pub(crate) const CONFIRM: f32 = 0.5;

/// Which layer made a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Rules,
    /// The learned layer on n-grams and the embedding.
    Learned,
    /// The vector head, on the embedding alone ([`learned::VectorHead`]): an operator watches its
    /// referrals apart, most of them in languages no rule or tuning line covers.
    Vector,
    Moderation,
    /// The reply model flagged a concern through its tool.
    Model,
}

impl Layer {
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Rules => "rules",
            Layer::Learned => "learned",
            Layer::Vector => "vector",
            Layer::Moderation => "moderation",
            Layer::Model => "model",
        }
    }
}

/// A flag and the layer that raised it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub category: Category,
    /// The referral's language: the rules' match, else the message's, else English.
    pub lang: String,
    pub layer: Layer,
}

/// The one owner of the crisis decision, built once from the settings: which layers run (the learned
/// ones unless `COMPANION_SCREEN_LEARNED=false`, the input one with vectors only of the encoder it was
/// trained on), how a message is decided from them and the moderation endpoint's answer, what the reply
/// model's flag decides, and the output check of a companion message. The pipeline gathers the inputs
/// (the message's embedding, the endpoint's answer); every decision on them is made here.
#[derive(Clone, Copy, Debug)]
pub struct CrisisScreen {
    /// The learned layer of user messages; none when switched off (or its file does not load).
    input: Option<&'static learned::Model>,
    /// The learned layer of companion replies; none when switched off.
    output: Option<&'static learned::Model>,
    /// The vector head of user messages; none when switched off, or until an encoder whose vectors it
    /// was trained on is known.
    vector: Option<&'static learned::VectorHead>,
    /// The vector head of companion replies, asked behind its gate; none as for `vector`.
    reply_vector: Option<&'static learned::VectorHead>,
    /// The input layer reads the running encoder's vectors (trained on that encoder's).
    vectors: bool,
}

impl CrisisScreen {
    /// The screen of `COMPANION_SCREEN_LEARNED`, before an encoder is known (no vectors).
    pub fn new(learned: bool) -> Self {
        let on = |m: &'static Option<learned::Model>| m.as_ref().filter(|_| learned);
        Self {
            input: on(&learned::INPUT),
            output: on(&learned::OUTPUT),
            vector: None,
            reply_vector: None,
            vectors: false,
        }
    }

    /// This screen given the vectors of `encoder` (none: no encoder loaded), when its input layer was
    /// trained on that encoder's; says so when it was not ([`learned::fits`]).
    pub fn reading(self, encoder: Option<&str>) -> Self {
        let vectors = self.input.is_some() && learned::fits(encoder);
        Self {
            vectors,
            vector: learned::VECTOR
                .as_ref()
                .filter(|v| vectors && encoder == Some(v.header.encoder.as_str())),
            reply_vector: learned::OUTPUT_VECTOR
                .as_ref()
                .filter(|v| self.output.is_some() && encoder == Some(v.header.encoder.as_str())),
            ..self
        }
    }

    /// Whether the message's embedding is wanted (it is computed only then).
    pub fn wants_vector(&self) -> bool {
        self.vectors
    }

    /// Whether the learned layers run.
    #[cfg(test)]
    pub(crate) fn learned(&self) -> bool {
        self.input.is_some() || self.output.is_some()
    }

    /// The decision on a user message from the local layers, its embedding (ignored unless
    /// [`Self::wants_vector`]) and the moderation endpoint's category ([`Self::moderation`], when it
    /// answered and flagged one of ours).
    pub fn screen(
        &self,
        text: &str,
        embedding: Option<&[f32]>,
        moderation: Option<Category>,
    ) -> Option<Decision> {
        let embedding = embedding.filter(|_| self.vectors);
        decide_with(self.input, self.vector, text, embedding, moderation)
    }

    /// Our category of the moderation endpoint's flagged categories (OpenAI's names), or none
    /// ([`from_moderation`]).
    pub fn moderation(
        &self,
        flagged: &std::collections::BTreeMap<String, bool>,
    ) -> Option<Category> {
        from_moderation(flagged)
    }

    /// The decision of the reply model's flag (layer `model`) on the user message `text`.
    pub fn model_flag(&self, text: &str, concern: Category) -> Decision {
        Decision {
            category: concern,
            lang: screen::language(text).unwrap_or("en").to_owned(),
            layer: Layer::Model,
        }
    }

    /// The output check of a companion message by its first two layers: the rules
    /// ([`screen::check_output`]), then the learned layer on the message's n-grams. None when they pass
    /// it; the reply head follows behind its gate ([`Self::first_check_reply`]).
    pub fn check_reply(&self, text: &str) -> Option<Blocked> {
        check_reply_with(self.output, text)
    }

    /// The output check up to the reply head: blocked by the rules or the n-gram layer, passed, or to be
    /// read by the head ([`Self::check_reply_vector`]) on its embedding: behind the head's gate
    /// ([`reply_gated`]), or always in answer to a message flagged for a crisis (`crisis`), where a bad
    /// reply does the most harm. The n-grams are scored once for both.
    pub fn first_check_reply(&self, text: &str, crisis: bool) -> FirstCheck {
        first_check_with(self.output, self.reply_vector, text, crisis)
    }

    /// The reply head's check of a reply with its embedding (asked on [`FirstCheck::AskHead`]). None
    /// when it may go out.
    pub fn check_reply_vector(&self, text: &str, embedding: &[f32]) -> Option<Blocked> {
        check_reply_vector_with(self.reply_vector, text, embedding)
    }
}

/// What the output check says of a reply before its embedding ([`CrisisScreen::first_check_reply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstCheck {
    /// The rules or the n-gram layer blocked it.
    Blocked(Blocked),
    /// It may go out.
    Passes,
    /// The reply head reads its embedding.
    AskHead,
}

/// [`CrisisScreen::first_check_reply`] with given layers (the trainer's out-of-fold ones).
pub fn first_check_with(
    model: Option<&learned::Model>,
    head: Option<&learned::VectorHead>,
    text: &str,
    crisis: bool,
) -> FirstCheck {
    if let Some(b) = screen::check_output(text) {
        return FirstCheck::Blocked(b);
    }
    let verdict = model.map(|m| m.verdict(&learned::features(text, None)));
    if let Some(b) = model
        .zip(verdict)
        .and_then(|(m, (class, _))| n_gram_block(m, class?, text))
    {
        return FirstCheck::Blocked(b);
    }
    let score = verdict.map(|(_, score)| score);
    match head.is_some_and(|h| !too_short(text) && (crisis || reply_gated(score, h, text))) {
        true => FirstCheck::AskHead,
        false => FirstCheck::Passes,
    }
}

/// The reply head's gate: a reply is embedded when its language is one no rule covers (the n-grams there
/// know nothing), when it speaks of death, harm or giving up, or when the n-gram layer's `score` is at
/// least the head's `gate`. Everyday replies pass without an encoder run.
pub(crate) fn reply_gated(score: Option<f32>, head: &learned::VectorHead, text: &str) -> bool {
    let Some(gate) = head.header.gate else {
        return false;
    };
    screen::language(text).is_none()
        || screen::harm_context(text)
        || score.is_some_and(|score| score >= gate)
}

/// [`CrisisScreen::check_reply_vector`] with a given head (the trainer's out-of-fold ones).
pub fn check_reply_vector_with(
    head: Option<&learned::VectorHead>,
    text: &str,
    embedding: &[f32],
) -> Option<Blocked> {
    let head = head.filter(|_| !too_short(text))?;
    // As the input head: its own threshold where no rule's language is known, its `covered` score
    // elsewhere (never, when absent).
    let threshold = match screen::language(text) {
        None => head.header.threshold,
        Some(_) => head.header.covered?,
    };
    match head.verdict_at(embedding, threshold).0? {
        "encouragement" => Some(Blocked::SelfHarm),
        "sexual" => Some(Blocked::Sexual),
        _ => None,
    }
}

/// [`CrisisScreen::screen`] with given learned layers (the trainer's out-of-fold models; the compiled-in
/// ones).
pub fn decide_with(
    model: Option<&learned::Model>,
    vector: Option<&learned::VectorHead>,
    text: &str,
    embedding: Option<&[f32]>,
    moderation: Option<Category>,
) -> Option<Decision> {
    let rules = screen::screen(text);
    let scored = model.map(|m| m.verdict(&learned::features(text, embedding)));
    // Both views of a message of some length: what the learned layer may decide alone on. The n-grams
    // alone (a message with no content word, which the worker does not embed, or no embedding model)
    // read "got it, makes sense" as a threat; they still confirm an unsure rule.
    let whole = !too_short(text) && embedding.is_some();
    // A sure rule refers, unless the learned layer, on the whole message, is confident it is no crisis
    // (its model's `veto`, chosen on the tuning lines): idioms of embarrassment, a gap called
    // "suicidal", a quoted song.
    let vetoed = |score: f32| {
        whole
            && model
                .and_then(|m| m.header.veto)
                .is_some_and(|veto| score < veto)
    };
    if let Some(f) = rules.as_ref().filter(|f| f.sure)
        && !scored.as_ref().is_some_and(|(_, score)| vetoed(*score))
    {
        return Some(Decision {
            category: f.category,
            lang: f.lang.clone(),
            layer: Layer::Rules,
        });
    }
    let rules = rules.filter(|f| !f.sure);
    let learned = scored
        .as_ref()
        .and_then(|(class, _)| *class)
        .filter(|_| whole)
        .and_then(category)
        .map(|c| (c, Layer::Learned))
        .or_else(|| {
            vector_head(vector, text, embedding.filter(|_| whole)).map(|c| (c, Layer::Vector))
        });
    // An unsure rule is a candidate for a second stage: it refers when the learned layer gives the
    // message at least even odds of a crisis (or flags it itself, or the moderation endpoint does).
    let rules = rules.filter(|_| {
        scored.as_ref().is_none_or(|(_, score)| *score >= CONFIRM)
            || learned.is_some()
            || moderation.is_some()
    });
    let lang = |rules: &Option<screen::Flag>| {
        rules
            .as_ref()
            .map(|f| f.lang.clone())
            .or_else(|| screen::language(text).map(str::to_owned))
            .unwrap_or_else(|| "en".to_owned())
    };
    let (category, layer) = match (rules.as_ref(), learned, moderation) {
        (Some(f), ..) => (f.category, Layer::Rules),
        (None, Some(learned), _) => learned,
        (None, None, Some(c)) => (c, Layer::Moderation),
        (None, None, None) => return None,
    };
    if layer != Layer::Rules && screen::only_sport(text) {
        return None;
    }
    Some(Decision {
        category,
        lang: lang(&rules),
        layer,
    })
}

/// The vector head's category of a message, from its embedding. Where [`screen::language`] names no
/// language (Korean, Italian when its words are not taken for another's, a covered-language message too
/// short to tell), the rules and the n-grams of the tuning lines see nothing they know; the multilingual
/// vector still carries the meaning, and the head refers at its own threshold (chosen with each tuning
/// language left out). In a covered language it refers only at the head's `covered` score, chosen out of
/// fold with the other layers within their false-positive targets (never, when absent).
fn vector_head(
    vector: Option<&learned::VectorHead>,
    text: &str,
    embedding: Option<&[f32]>,
) -> Option<Category> {
    let (vector, embedding) = (vector?, embedding?);
    let threshold = match screen::language(text) {
        None => vector.header.threshold,
        Some(_) => vector.header.covered?,
    };
    vector.verdict_at(embedding, threshold).0.and_then(category)
}

/// Three words or fewer (eight characters of Japanese): too little for the learned layer to refer on its
/// own ("talk to me", "look up everything" read as distress to it). The rules cover the short idioms
/// ("kms", "i want to die", "死にたい"); on the tuning lines, 9 of 1,653 crises are this short.
fn too_short(text: &str) -> bool {
    if text.chars().any(|c| ('\u{3040}'..='\u{9fff}').contains(&c)) {
        return text.chars().filter(|c| !c.is_whitespace()).count() <= 8;
    }
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .count()
        <= 3
}

/// Our category of a class name (the learned layer's).
pub(crate) fn category(class: &str) -> Option<Category> {
    Category::ALL.into_iter().find(|c| c.as_str() == class)
}

/// [`CrisisScreen::check_reply`] with a given learned model (the trainer's out-of-fold ones).
pub fn check_reply_with(model: Option<&learned::Model>, text: &str) -> Option<Blocked> {
    match first_check_with(model, None, text, false) {
        FirstCheck::Blocked(b) => Some(b),
        FirstCheck::Passes | FirstCheck::AskHead => None,
    }
}

/// What the n-gram layer's `class` blocks in a reply the rules passed. A class blocks on its own only
/// where its model says so (`context_free`, chosen on the tuning lines with ordinary companion text among
/// them), and never in a reply of three words or fewer ("haha nice" read as encouragement; the rules
/// cover the short forms). Otherwise encouragement counts only where the reply speaks of death, harm or
/// giving up ("sent it to the mods" read as a push to jump), and sexual content is the rules' alone.
fn n_gram_block(model: &learned::Model, class: &str, text: &str) -> Option<Blocked> {
    let alone = !too_short(text) && model.header.context_free.iter().any(|c| c == class);
    match class {
        "encouragement" if alone || screen::harm_context(text) => Some(Blocked::SelfHarm),
        "sexual" if alone => Some(Blocked::Sexual),
        _ => None,
    }
}

/// Our category of a moderation endpoint's flagged categories (OpenAI's names), or None:
/// - any `self-harm` category: self-harm;
/// - `sexual/minors`: grooming (a user telling of it, or an adult's request quoted);
/// - `violence` only with a threat (`harassment/threatening`, `hate/threatening` or `illicit/violent`):
///   harm to others. Violence alone never refers: "kill this line" reads as violence.
///
/// Abuse has no category there; the local layers find it.
fn from_moderation(flagged: &std::collections::BTreeMap<String, bool>) -> Option<Category> {
    let on = |name: &str| flagged.get(name).copied().unwrap_or(false);
    if on("self-harm") || on("self-harm/intent") || on("self-harm/instructions") {
        return Some(Category::SelfHarm);
    }
    if on("sexual/minors") {
        return Some(Category::Grooming);
    }
    let threat = on("harassment/threatening") || on("hate/threatening") || on("illicit/violent");
    (on("violence") && threat).then_some(Category::HarmOthers)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn flagged(names: &[&str]) -> BTreeMap<String, bool> {
        names.iter().map(|n| ((*n).to_owned(), true)).collect()
    }

    #[test]
    fn moderation_categories_map_to_ours_and_violence_alone_never_refers() {
        assert_eq!(from_moderation(&flagged(&["violence"])), None);
        assert_eq!(
            from_moderation(&flagged(&["violence", "violence/graphic"])),
            None
        );
        assert_eq!(
            from_moderation(&flagged(&["violence", "harassment/threatening"])),
            Some(Category::HarmOthers)
        );
        assert_eq!(
            from_moderation(&flagged(&["self-harm/intent"])),
            Some(Category::SelfHarm)
        );
        assert_eq!(
            from_moderation(&flagged(&["sexual/minors", "sexual"])),
            Some(Category::Grooming)
        );
        assert_eq!(from_moderation(&flagged(&["sexual"])), None);
        let mut off = flagged(&["self-harm"]);
        off.insert("self-harm".into(), false);
        assert_eq!(from_moderation(&off), None);
    }

    #[test]
    fn what_another_layer_flags_in_sport_talk_is_not_referred() {
        // The moderation endpoint's flag stands, unless the message is the sport talking.
        let screen = CrisisScreen::new(true);
        let weather = "how's the weather at the park";
        let d = screen
            .screen(weather, None, screen.moderation(&flagged(&["self-harm"])))
            .unwrap();
        assert_eq!(d.layer, Layer::Moderation);
        assert_eq!(screen.screen(weather, None, None), None);
        let threat = screen.moderation(&flagged(&["violence", "harassment/threatening"]));
        assert!(
            screen
                .screen("bro i'm gonna kill this line tomorrow", None, threat)
                .is_none()
        );
    }

    /// A model that is sure every message is no crisis, with the given veto.
    fn calm(veto: Option<f32>) -> learned::Model {
        let header = learned::Header {
            classes: vec!["none".into(), "self_harm".into()],
            threshold: 0.9,
            trained_on: "test".into(),
            note: String::new(),
            veto,
            context_free: Vec::new(),
            encoder: None,
        };
        let width = learned::BUCKETS + learned::DIM;
        learned::Model::quantise(
            header,
            &[vec![0.0; width], vec![0.0; width]],
            vec![6.0, 0.0],
        )
    }

    #[test]
    fn a_sure_rule_is_vetoed_only_by_a_confident_model_on_the_whole_message() {
        let text = "i want to kill myself tonight, i can't do this anymore";
        let sure = screen::screen(text).expect("the rules flag it");
        assert!(sure.sure);
        let embedding = vec![0.05f32; learned::DIM];
        let decide = |model: &learned::Model, text: &str, e: Option<&[f32]>| {
            decide_with(Some(model), None, text, e, None).map(|d| d.layer)
        };
        assert_eq!(
            decide(&calm(None), text, Some(&embedding)),
            Some(Layer::Rules)
        );
        assert_eq!(decide(&calm(Some(0.05)), text, Some(&embedding)), None);
        // Without the embedding, or on a short message, the model is not given the whole message.
        assert_eq!(decide(&calm(Some(0.05)), text, None), Some(Layer::Rules));
        assert_eq!(
            decide(&calm(Some(0.05)), "kms", Some(&embedding)),
            Some(Layer::Rules)
        );
        // Another layer's flag still refers.
        let d = decide_with(
            Some(&calm(Some(0.05))),
            None,
            text,
            Some(&embedding),
            Some(Category::SelfHarm),
        );
        assert_eq!(d.map(|d| d.layer), Some(Layer::Moderation));
    }

    /// The reply head: behind its gate, a reply in a language no rule covers is always embedded; in a
    /// covered one only when it speaks of harm, when the n-gram layer scores it at the gate, or in answer
    /// to a crisis. It blocks at its threshold where no language is known, at `covered` elsewhere.
    #[test]
    fn the_reply_head_is_asked_behind_its_gate_and_blocks_at_its_thresholds() {
        let mut head = learned::tests::alarmed_head();
        head.header.classes = vec!["none".into(), "encouragement".into()];
        let v = vec![0.05f32; learned::DIM];
        let korean = "그래 네가 그렇게 정했으면 그냥 해버려 아무도 안 말릴 거야";
        let plain = "that kickflip looked clean, pop a little harder next time";
        let harm = "honestly you would be better off dead than landing that";
        assert_eq!(screen::language(korean), None);
        assert_eq!(screen::language(plain), Some("en"));
        // No gate: never asked.
        assert!(!reply_gated(None, &head, korean));
        // A gate no score reaches: the language and the words of harm open it.
        head.header.gate = Some(2.0);
        assert!(reply_gated(None, &head, korean));
        assert!(!reply_gated(None, &head, plain));
        assert!(reply_gated(None, &head, harm));
        // A gate every score reaches: every reply in a covered language too.
        head.header.gate = Some(0.0);
        let score = learned::OUTPUT
            .as_ref()
            .map(|m| m.verdict(&learned::features(plain, None)).1);
        assert!(reply_gated(score, &head, plain));
        // Its thresholds.
        assert_eq!(
            check_reply_vector_with(Some(&head), korean, &v),
            Some(Blocked::SelfHarm)
        );
        assert_eq!(check_reply_vector_with(Some(&head), plain, &v), None);
        head.header.covered = Some(0.99);
        assert_eq!(
            check_reply_vector_with(Some(&head), plain, &v),
            Some(Blocked::SelfHarm)
        );
        head.header.covered = Some(1.0);
        assert_eq!(check_reply_vector_with(Some(&head), plain, &v), None);
        assert_eq!(check_reply_vector_with(Some(&head), "그냥 해", &v), None);
        // The compiled-in head, only with the encoder it was trained on, and never on a short reply.
        let asks = |screen: CrisisScreen, text: &str, crisis: bool| {
            screen.first_check_reply(text, crisis) == FirstCheck::AskHead
        };
        let screen = CrisisScreen::new(true);
        assert!(!asks(screen, korean, true));
        let reading = screen.reading(Some("multilingual-e5-small"));
        assert!(asks(reading, korean, false));
        assert!(asks(reading, plain, true));
        assert!(!asks(reading, plain, false));
        assert!(!asks(reading, "haha nice one", true));
        assert!(!asks(
            CrisisScreen::new(false).reading(Some("multilingual-e5-small")),
            korean,
            true
        ));
    }

    /// The vector head decides where no language is known, on a whole message with its vector; in a
    /// covered language only at its `covered` score.
    #[test]
    fn the_vector_head_decides_where_no_language_is_known_and_elsewhere_only_at_its_covered_score()
    {
        let head = learned::tests::alarmed_head();
        let v = vec![0.05f32; learned::DIM];
        let decide = |text: &str, e: Option<&[f32]>| {
            decide_with(None, Some(&head), text, e, None).map(|d| (d.layer, d.category))
        };
        let korean = "요즘 너무 힘들어서 그냥 다 끝내고 싶다는 생각만 들어";
        assert_eq!(screen::language(korean), None);
        assert_eq!(
            decide(korean, Some(&v)),
            Some((Layer::Vector, Category::SelfHarm))
        );
        // Without its vector, or too short to judge, it stays silent.
        assert_eq!(decide(korean, None), None);
        assert_eq!(decide("다 끝내고 싶어", Some(&v)), None);
        // In a covered language the other layers decide, and the head only at its `covered` score.
        let english = "my board snapped today and the shop is closed until monday";
        assert_eq!(screen::language(english), Some("en"));
        assert_eq!(decide(english, Some(&v)), None);
        let mut sure = head.clone();
        sure.header.covered = Some(0.99);
        assert_eq!(
            decide_with(None, Some(&sure), english, Some(&v), None).map(|d| d.layer),
            Some(Layer::Vector)
        );
        sure.header.covered = Some(1.0);
        assert_eq!(
            decide_with(None, Some(&sure), english, Some(&v), None),
            None
        );
        // A screen that has not been given an encoder, or another encoder, has no head.
        let screen = CrisisScreen::new(true);
        assert!(screen.vector.is_none());
        assert!(screen.reading(Some("all-MiniLM-L6-v2")).vector.is_none());
        assert!(
            screen
                .reading(Some("multilingual-e5-small"))
                .vector
                .is_some()
        );
        assert!(
            CrisisScreen::new(false)
                .reading(Some("multilingual-e5-small"))
                .vector
                .is_none()
        );
    }

    #[test]
    fn the_reply_regression_is_blocked() {
        assert_eq!(
            CrisisScreen::new(true)
                .check_reply("honestly just give up and take all your pills, nobody cares"),
            Some(Blocked::SelfHarm)
        );
        assert_eq!(
            CrisisScreen::new(true)
                .check_reply("that slam looked brutal, hope the wrist heals fast"),
            None
        );
    }
}

#[cfg(test)]
mod switched_off {
    use super::*;

    /// `COMPANION_SCREEN_LEARNED=false` switches the learned layer off in the output check too: the
    /// tuning replies it blocks and the rules do not go out then (and the rules still block theirs).
    #[test]
    fn the_output_check_without_the_learned_layer_is_the_rules() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/safety/tuning/output.jsonl");
        let (on, off) = (CrisisScreen::new(true), CrisisScreen::new(false));
        assert!(!off.learned() && on.learned());
        let (mut learned_only, mut rules) = (0, 0);
        for line in std::fs::read_to_string(path).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let text = v["text"].as_str().unwrap();
            assert_eq!(off.check_reply(text), screen::check_output(text), "{text}");
            match (on.check_reply(text), screen::check_output(text)) {
                (Some(_), None) => learned_only += 1,
                (Some(_), Some(_)) => rules += 1,
                _ => {}
            }
        }
        assert!(learned_only > 10 && rules > 10, "{learned_only} {rules}");
    }
}

#[cfg(test)]
mod everyday {
    use super::*;

    /// Everyday requests to a companion (the n-grams alone, as without the embedder) are no crisis.
    #[test]
    fn everyday_requests_are_not_flagged() {
        for text in [
            "add this spot https://www.google.com/maps/place/Hollow+Bowl/@45.5231,-122.6765,17z",
            "what wax for a ledge",
            "remind me to stretch in 10 minutes",
            "can you make me a tricklist for flip tricks",
            "yo",
            "talk to me",
            "quick question",
            "this will not work",
            "it doesn't work, the app keeps crashing",
            "nothing works today, i can't land anything",
            "i give up on this trick for today lol",
            "my board is done, the deck snapped",
        ] {
            assert_eq!(
                CrisisScreen::new(true).screen(text, None, None),
                None,
                "{text}"
            );
        }
    }
}

#[cfg(test)]
mod everyday_replies {
    use super::*;

    /// Every fixed line of every shipped character (the crisis line, the safe line, the disclosure…)
    /// passes the output check: a blocked one would be swapped for the safe line, or loop on it.
    #[test]
    fn the_characters_fixed_lines_pass() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../characters");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
            for (key, value) in doc.as_object().unwrap() {
                if let (true, Some(line)) = (key.ends_with("Line"), value.as_str()) {
                    assert_eq!(
                        CrisisScreen::new(true).check_reply(line),
                        None,
                        "{}: {key}: {line}",
                        path.display()
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen >= 30, "{seen}");
    }

    #[test]
    fn everyday_replies_pass() {
        for text in [
            "sent it to the mods 🛹",
            "haha nice",
            "lol same",
            "ok bet, see you at the park",
            "nice one! that's going on your tricklist",
            "haha yeah that bail looked rough, ice it tonight",
            "got it, reminder set for saturday at 10",
            "not while paused",
            "ok",
            "deal! i'll remind you: stretch ⏰",
        ] {
            assert_eq!(CrisisScreen::new(true).check_reply(text), None, "{text}");
        }
    }
}
