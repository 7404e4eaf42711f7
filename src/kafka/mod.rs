//! Kafka plumbing: the producer every process publishes through, the consumer
//! runtime that stores an offset only after the work behind it was delivered,
//! and topic administration.

pub mod admin;
pub mod consumer;
pub mod consumers;
pub mod context;
pub mod durability;
pub mod groups;
pub mod lane;
pub mod ledger;
pub mod offsets;
pub mod passing;
pub mod publisher;
pub mod reader;
pub mod record;
pub mod topics;

pub use consumer::{ConsumerSpec, HandlerError, RecordHandler};
pub use consumers::Consumers;
pub use lane::lane_of;
pub use publisher::{PublishError, Publisher};
pub use record::Record;
