//! End-to-end tests: the binaries driven as a user drives them, against real registries, real
//! components and a real local node in temporary directories.

mod data_dir;
mod guides;
mod plugin_author;
mod quickstart;
mod replicas;
mod sign_in;
