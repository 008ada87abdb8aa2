//! Any configuration text: a Config or a list of errors, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(evi::config::ConfigError::Invalid(errors)) = evi::config::Config::parse(text) {
        assert!(!errors.is_empty());
    }
});
