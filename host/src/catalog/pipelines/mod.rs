//! Pipelines in the catalog: their definitions and the hosts' reports on them.
//!
//! A pipeline is a definition ([`PipelineRecord`]) every `weir serve` host that runs pipelines
//! reads (`crate::runner`): each host runs the pipeline's consumer-group member, so Kafka
//! divides the partitions among the hosts, and each writes what it runs into a
//! [`HostStatus`]. The API (`crate::api::pipelines`) manages the definitions and merges the
//! fresh reports ([`merge_status`]).
//!
//! Layout under the catalog prefix (beside [`super::Catalog`]'s):
//! - `tenants/{tenant}/pipelines/{name}/revisions/{revision:010}.json` — the definition; every
//!   change writes the next revision, created once (`PutMode::Create`), so two hosts changing
//!   a pipeline at once cannot both win (the loser answers 409) on every store;
//! - `tenants/{tenant}/pipelines/{name}/hosts/{host}.json` — one host's [`HostStatus`];
//! - `pipelines-changed.json` — overwritten after every revision: runners read the
//!   definitions again when its version changed (`Catalog::definitions_marker`);
//! - `tenants/{tenant}/state/{uid}/…` — the pipeline's keyed state (LSM shards);
//! - `tenants/{tenant}/logs/{uid}/{host}/…` — its operator's log segments ([`super::logs`]).
//!
//! Topic names are the tenant's own: topic `orders` of tenant `acme` is the Kafka topic
//! `acme.orders` ([`kafka_topic`]), so no tenant can name another's topic.
//!
//! The parts: [`spec`] — the definition and its validation; `definitions` — every
//! definition, read again only after a change ([`Definitions`]); [`stages`] — a pipeline of
//! stages' part of it; [`status`] — what hosts report and the merged status; `store` — reading
//! and writing them in the catalog's store.

mod definitions;
pub mod spec;
pub mod stages;
pub mod status;
mod store;

pub use definitions::{Definitions, FULL_READ_EVERY};
pub use spec::*;
pub use stages::*;
pub use status::*;
