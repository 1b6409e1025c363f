//! The journal's covering step under two attempts of one job at once (a redelivery that arrives while
//! the first delivery still runs): both attempts end with the same record, and exactly the jobs that
//! record names are covered. If each attempt covered the followers it saw and then raced to record its
//! own list, the loser's extra followers would be left covered by a reply that never answered them (a
//! few events of the MongoDB outage test never answered).

use bson::oid::ObjectId;
use companion_dev::stub::{StubReply, always};
use companion_journal::NewJob;

use crate::env::*;

#[tokio::test]
async fn two_attempts_covering_at_once_agree_and_cover_only_what_they_record() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let journal = env.journal();
    let (user, bot, conversation) = (
        ObjectId::new().to_hex(),
        ObjectId::new().to_hex(),
        ObjectId::new().to_hex(),
    );
    fn job<'a>(id: &'a str, seq: u64, who: &'a [String; 3]) -> NewJob<'a> {
        NewJob {
            id,
            kind: "dm_turn",
            user: &who[0],
            bot: &who[1],
            conversation: &who[2],
            stream_seq: Some(seq),
            reads: Default::default(),
        }
    }
    let who = [user, bot, conversation];
    for round in 0..10 {
        let head_id = ObjectId::new().to_hex();
        let head = job(&head_id, 1, &who);
        let ids: Vec<String> = (0..6).map(|_| ObjectId::new().to_hex()).collect();
        let all: Vec<NewJob> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| job(id, 2 + i as u64, &who))
            .collect();
        // The first attempt saw one follower in the stream, the second (later) all six.
        let (a, b) = (
            journal.open(&head).await.unwrap(),
            journal.open(&head).await.unwrap(),
        );
        let names = |n: usize| -> Vec<String> { ids[..n].to_vec() };
        let (ra, rb) = tokio::join!(
            a.covering("burst", "", &all[..1], names),
            b.covering("burst", "", &all, names),
        );
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert_eq!(ra, rb, "round {round}: both attempts go on with one burst");
        let mut covered = Vec::new();
        for id in &ids {
            let r = journal.get(id).await.unwrap();
            if r.is_some_and(|r| r.covered_by.as_deref() == Some(head_id.as_str())) {
                covered.push(id.clone());
            }
        }
        assert_eq!(
            covered, ra,
            "round {round}: covered exactly the followers the recorded burst answers"
        );
    }
    env.finish().await;
}
