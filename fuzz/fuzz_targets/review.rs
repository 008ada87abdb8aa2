//! Bytes in, response out, as the server does, checked by the shared oracle.
#![no_main]
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/common/oracle.rs"]
mod oracle;

static CONFIG: LazyLock<evi::config::Config> = LazyLock::new(|| {
    evi::config::Config::parse(include_str!("../../tests/data/config.yaml"))
        .expect("fixture config")
});

fuzz_target!(|data: &[u8]| oracle::check_review(&CONFIG, data));
