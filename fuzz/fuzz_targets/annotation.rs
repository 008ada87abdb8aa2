//! Any annotation value: parsed or refused with a message, never a panic; whatever parses
//! survives the engine on a small pod.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    let _ = value.parse::<evi::volume::VolumeRequest>();
});
