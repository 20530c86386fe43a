//! `alexandria-bench`: a deterministic corpus generator and a benchmark that drives the
//! real `alexandria` shim and `alexandriad` daemon (issue 6). `main.rs` is the glue;
//! the modules hold the corpus, the clients, process control, timing and the report.

pub mod client;
pub mod corpus;
pub mod httpd;
pub mod machine;
pub mod pdf;
pub mod procs;
pub mod rebuild;
pub mod report;
pub mod run;
pub mod search;
pub mod soak;
pub mod sources;
pub mod stats;
pub mod sync;
pub mod web;
pub mod writes;
