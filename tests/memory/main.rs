//! The in-memory and pure tests, in one binary (each test binary links the whole AWS SDK): the
//! handler over the in-memory ledger and its fakes, the providers against scripted local
//! servers, the simulation and the model. None needs the emulator.

#[path = "../support/mod.rs"]
mod support;

// The simulation of `make chaos` and the protocol of `make model-check`, at the crate root
// where their own paths (`crate::sim`, `crate::protocol`) find them; their figures and printing
// belong to the examples, and these tests read the invariants.
#[allow(dead_code)]
#[path = "../../examples/model/protocol.rs"]
mod protocol;
#[allow(dead_code)]
#[path = "../../examples/chaos/sim.rs"]
mod sim;

mod batches;
mod bill;
mod chaos;
mod contracts;
mod dead_letters;
mod events;
mod handler;
mod logs;
mod model_check;
mod operator;
mod pacing;
mod providers;
mod scale;
mod spend;
mod traces;
