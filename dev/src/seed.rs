//! Demo data: Extended-JSON files (one per collection) upserted by `_id`, so seeding twice changes nothing.

use std::path::Path;

use bson::{Bson, Document, doc};
use mongodb::options::ReplaceOptions;

use bson::oid::ObjectId;
use futures::TryStreamExt;

use companion_store::store::{Mongo, StoreError, TRICKLISTS, USERS, user_ref, user_ref_filter};

#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("cannot read {0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}: {1}")]
    Parse(String, String),
    #[error("no demo user `{0}` to copy (seed first)")]
    NoUser(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<mongodb::error::Error> for SeedError {
    fn from(e: mongodb::error::Error) -> Self {
        Self::Store(e.into())
    }
}

/// A new user like the demo user `like` (its profile and own tricklists, under fresh ids), named
/// `<like>-<6 hex>`: a scripted demo run talks as its own user, so no flood limit, write quota, history or
/// flow of an earlier run carries over. Returns the new username.
pub async fn demo_user(mongo: &Mongo, like: &str) -> Result<String, SeedError> {
    let users = mongo.collection(USERS);
    let mut user = users
        .find_one(doc! { "username": like })
        .await?
        .ok_or_else(|| SeedError::NoUser(like.to_owned()))?;
    let original = user
        .get_object_id("_id")
        .map_err(|_| SeedError::NoUser(like.to_owned()))?;
    let id = ObjectId::new();
    let username = format!("{like}-{}", &id.to_hex()[18..]);
    user.insert("_id", id);
    user.insert("username", &username);
    if let Ok(email) = user.get_str("email") {
        let email = email.replacen('@', &format!("+{}@", &id.to_hex()[18..]), 1);
        user.insert("email", email);
    }
    users.insert_one(user).await?;
    let lists = mongo.collection(TRICKLISTS);
    // The user's own lists, not those a companion made in an earlier demo run.
    let theirs =
        doc! { "$and": [user_ref_filter("user", original), { "createdBy": { "$exists": false } }] };
    let mut theirs: Vec<Document> = lists.find(theirs).await?.try_collect().await?;
    for l in &mut theirs {
        l.insert("_id", ObjectId::new());
        l.insert("user", user_ref(id));
    }
    if !theirs.is_empty() {
        lists.insert_many(theirs).await?;
    }
    Ok(username)
}

/// Loads every `<collection>.json` in `dir`; returns `(collection, documents)` counts.
pub async fn seed_dir(mongo: &Mongo, dir: &Path) -> Result<Vec<(String, usize)>, SeedError> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| SeedError::Io(dir.display().to_string(), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut counts = Vec::new();
    for path in files {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        let docs = read_documents(&path)?;
        let coll = mongo.collection(&name);
        for d in &docs {
            let id = d.get("_id").cloned().unwrap_or(Bson::Null);
            coll.replace_one(doc! { "_id": id }, d.clone())
                .with_options(ReplaceOptions::builder().upsert(true).build())
                .await
                .map_err(StoreError::from)?;
        }
        counts.push((name, docs.len()));
    }
    Ok(counts)
}

/// One seed file: a JSON array of Extended-JSON documents.
pub fn read_documents(path: &Path) -> Result<Vec<Document>, SeedError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| SeedError::Io(p.clone(), e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| SeedError::Parse(p.clone(), e.to_string()))?;
    let bson = Bson::try_from(value).map_err(|e| SeedError::Parse(p.clone(), e.to_string()))?;
    match bson {
        Bson::Array(items) => items
            .into_iter()
            .map(|b| match b {
                Bson::Document(d) => Ok(d),
                other => Err(SeedError::Parse(
                    p.clone(),
                    format!("expected documents, found {other}"),
                )),
            })
            .collect(),
        _ => Err(SeedError::Parse(p, "expected a JSON array".into())),
    }
}
