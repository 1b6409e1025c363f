//! Where the companion worker reads and writes: the databases (`store`: MongoDB for the app's data,
//! PostgreSQL for the companion's own), the bus (`bus`: NATS JetStream in and out) and the order of each
//! conversation's messages across workers (`conversation_order`).

pub mod bus;
pub mod conversation_order;
pub mod store;

#[cfg(feature = "testing")]
use companion_core::fault;
use companion_core::{config, failure, timing};
