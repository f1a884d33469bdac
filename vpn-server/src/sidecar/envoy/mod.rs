//! Envoy mode: the sidecar as Gardener's `envoy-proxy` container runs it. This part reads
//! the bootstrap file Gardener gives that container ([`bootstrap`], over the strict YAML walk
//! of [`yaml`]).

pub mod bootstrap;
pub mod yaml;
