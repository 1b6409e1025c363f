//! The scripted model's memory: it answers the worker's extraction and summary requests
//! (`companion_memory::extract`) by rules, so the offline demo and the tests show facts being learned
//! without a paid model. Facts come from first-person statements ("my home park is burnside", "i ride
//! goofy", "i broke my wrist last month", "remember i'm scared of dropping in"); the summary keeps the
//! gist of the messages that left the window.

use serde_json::{Value, json};

use companion_memory::{EXTRACT_MARKER, SUMMARY_MARKER};

/// The answer to a memory request, or `None` for any other request.
pub fn answer(body: &Value) -> Option<String> {
    let (system, user) = request(body)?;
    if system.starts_with(EXTRACT_MARKER) {
        return Some(extract(user).to_string());
    }
    Some(summarize(user))
}

/// Whether `body` is one of the worker's memory requests (extraction or summary), not a turn's.
pub fn is_memory_request(body: &Value) -> bool {
    request(body).is_some()
}

/// A memory request's system prompt and its numbered messages.
fn request(body: &Value) -> Option<(&str, &str)> {
    let messages = body["messages"].as_array()?;
    let system = messages.first()?["content"].as_str()?;
    let user = messages.get(1)?["content"].as_str().unwrap_or("");
    (system.starts_with(EXTRACT_MARKER) || system.starts_with(SUMMARY_MARKER))
        .then_some((system, user))
}

/// `{"facts": [...]}` from the numbered lines (`N. text`) of an extraction request.
pub fn extract(request: &str) -> Value {
    let mut facts = Vec::new();
    let lines = request
        .split_once("Conversation (numbered lines are the user's):")
        .map_or(request, |(_, l)| l);
    for line in lines.lines() {
        let Some((n, text)) = line.split_once(". ") else {
            continue;
        };
        let Ok(n) = n.trim().parse::<u64>() else {
            continue;
        };
        for (topic, fact) in facts_in(text) {
            facts.push(json!({"topic": topic, "fact": fact, "sources": [n]}));
        }
    }
    json!({ "facts": facts })
}

/// The facts one message states about its writer: (topic, fact in the third person).
pub fn facts_in(text: &str) -> Vec<(&'static str, String)> {
    let lower = text.to_lowercase();
    let lower = lower
        .trim()
        .trim_start_matches("remember,")
        .trim_start_matches("remember")
        .trim_start_matches(':')
        .trim()
        .trim_start_matches("that ")
        .to_owned();
    let mut out = Vec::new();
    let rest = |after: &str| -> Option<String> {
        let (_, r) = lower.split_once(after)?;
        let r = r
            .split(['.', ',', '!', '?', ';'])
            .next()
            .unwrap_or("")
            .trim()
            .trim_end_matches(" lol")
            .to_owned();
        (!r.is_empty() && r.len() <= 80).then_some(r)
    };
    for stance in ["goofy", "regular"] {
        if [
            format!("i ride {stance}"),
            format!("i skate {stance}"),
            format!("i'm {stance}"),
            format!("im {stance}"),
            format!("switched to {stance}"),
        ]
        .iter()
        .any(|p| lower.contains(p.as_str()))
        {
            out.push(("stance", format!("rides {stance}")));
        }
    }
    for (after, topic, lead) in [
        ("my home park is ", "home_spot", "home spot is "),
        ("my home spot is ", "home_spot", "home spot is "),
        ("my local park is ", "home_spot", "home spot is "),
        ("i usually skate at ", "home_spot", "home spot is "),
        ("my name is ", "name", "is called "),
        ("call me ", "name", "likes to be called "),
        ("i'm scared of ", "fear", "is scared of "),
        ("im scared of ", "fear", "is scared of "),
        ("i'm afraid of ", "fear", "is afraid of "),
        ("i want to learn ", "goal", "wants to learn "),
        ("i wanna learn ", "goal", "wants to learn "),
        ("my deck is ", "gear", "rides a deck: "),
        ("i love ", "like", "loves "),
    ] {
        if let Some(r) = rest(after) {
            out.push((topic, format!("{lead}{r}")));
        }
    }
    for verb in ["broke", "sprained", "hurt", "injured", "fractured"] {
        if let Some(r) = rest(&format!("i {verb} my ")) {
            out.push(("injury", format!("{verb} their {r}")));
        }
    }
    for level in ["beginner", "intermediate", "advanced"] {
        if lower.contains(&format!("i'm a {level}"))
            || lower.contains(&format!("im a {level}"))
            || lower.contains(&format!("i'm {level}"))
        {
            out.push(("level", format!("is {level}")));
        }
    }
    out
}

/// The previous summary with the gist of the new messages, at most ~600 characters (oldest cut first).
pub fn summarize(request: &str) -> String {
    let previous = request
        .strip_prefix("Summary so far:\n")
        .and_then(|r| r.split_once("\n\nMessages:\n"))
        .map(|(p, _)| p.trim())
        .filter(|p| *p != "(none)")
        .unwrap_or("");
    let said: Vec<String> = request
        .lines()
        .filter_map(|l| l.strip_prefix("User: "))
        .take(5)
        .map(|l| l.chars().take(50).collect())
        .collect();
    let mut summary = previous.to_owned();
    if !said.is_empty() {
        if !summary.is_empty() {
            summary.push(' ');
        }
        summary.push_str(&format!("The user talked about: {}.", said.join("; ")));
    }
    let chars: Vec<char> = summary.chars().collect();
    if chars.len() > 600 {
        summary = chars[chars.len() - 600..].iter().collect();
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_person_statements_become_facts() {
        assert_eq!(
            facts_in("remember, i ride goofy"),
            [("stance", "rides goofy".into())]
        );
        assert_eq!(
            facts_in("my home park is Burnside. it's rad"),
            [("home_spot", "home spot is burnside".into())]
        );
        assert_eq!(
            facts_in("I broke my wrist last month"),
            [("injury", "broke their wrist last month".into())]
        );
        assert_eq!(
            facts_in("i switched to regular stance"),
            [("stance", "rides regular".into())]
        );
        assert!(facts_in("my friend rides goofy").is_empty());
        assert!(facts_in("how do i ollie?").is_empty());
        let v = extract(
            "Conversation (numbered lines are the user's):\n1. hi\nKaori: hey!\n2. i'm scared of dropping in\n",
        );
        assert_eq!(
            v,
            json!({"facts": [{"topic": "fear", "fact": "is scared of dropping in", "sources": [2]}]})
        );
    }

    #[test]
    fn the_summary_keeps_the_gist_and_stays_short() {
        let s = summarize(
            "Summary so far:\n(none)\n\nMessages:\nUser: i broke my wrist\nKaori: oh no\n",
        );
        assert_eq!(s, "The user talked about: i broke my wrist.");
        let long = format!(
            "Summary so far:\n{}\n\nMessages:\nUser: more\n",
            "x".repeat(700)
        );
        assert!(summarize(&long).chars().count() <= 600);
    }
}
