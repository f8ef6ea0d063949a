//! The path an attempt takes to its model: a line of a provider batch, a service tier (flex,
//! priority) or a standard call, chosen for each attempt by price within the job's deadline.
//!
//! A path is the [`Rate`] it is paid at. The worker offers the paths the deployment allows
//! (`PATHS`) that the provider sells for the model (a tier the price table prices for it, a
//! batch interface), each with what the attempt would cost on it and how long it is expected to
//! take; [`choose`] takes the cheapest that ends before the deadline with room left for one
//! standard call after it, else the fastest. A job that asks for a path (`deferrable`,
//! `parameters.service_tier`) gets it when it is offered.

use super::Millis;
use super::usage::Rate;

/// Every path, cheapest kind first.
pub const ALL: [Rate; 4] = [Rate::Batch, Rate::Flex, Rate::Standard, Rate::Priority];

/// A path's name, as `PATHS`, the attempt and `jobctl show` write it.
pub fn name(rate: Rate) -> &'static str {
    match rate {
        Rate::Standard => "standard",
        Rate::Batch => "batch",
        Rate::Flex => "flex",
        Rate::Priority => "priority",
    }
}

/// The path named `text`.
pub fn parse(text: &str) -> Option<Rate> {
    ALL.into_iter().find(|r| name(*r) == text)
}

/// The paths a deployment lets the worker choose (`PATHS`, comma-separated). Unset, it
/// chooses nothing: each job takes the path it asks for, else the standard one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Paths {
    allowed: [bool; 4],
}

impl Paths {
    /// Parses `batch,flex,standard,priority` (any of them, any order). The standard path is
    /// always allowed: it is where a job goes when nothing else fits.
    pub fn parse(text: &str) -> Result<Paths, String> {
        let mut paths = Paths::default();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let rate = parse(word).ok_or_else(|| {
                format!("{word:?} is not a path (batch, flex, standard, priority)")
            })?;
            paths.allowed[index(rate)] = true;
        }
        if paths.any() {
            paths.allowed[index(Rate::Standard)] = true;
        }
        Ok(paths)
    }

    /// Whether the worker chooses at all.
    pub fn any(&self) -> bool {
        self.allowed.iter().any(|a| *a)
    }

    /// Whether `rate` may be chosen.
    pub fn allows(&self, rate: Rate) -> bool {
        self.allowed[index(rate)]
    }
}

fn index(rate: Rate) -> usize {
    ALL.iter().position(|r| *r == rate).unwrap_or(2)
}

/// How long the attempts of one provider and model took on each path, from their claim to
/// their answer: the last [`Times::KEPT`] of each, measured by one execution environment or, with
/// a shared store, by all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Times {
    taken: [std::collections::VecDeque<Millis>; 4],
}

impl Times {
    /// How many of each path's times are kept.
    pub const KEPT: usize = 32;
    /// How many a path needs before its measure is taken over its documented bound.
    pub const ENOUGH: usize = 8;

    /// An attempt on `rate` took `ms`.
    pub fn record(&mut self, rate: Rate, ms: Millis) {
        let taken = &mut self.taken[index(rate)];
        if taken.len() == Self::KEPT {
            taken.pop_front();
        }
        taken.push_back(ms.max(0));
    }

    /// Each path's kept times, in [`ALL`]'s order, oldest first.
    pub fn lists(&self) -> [Vec<Millis>; 4] {
        std::array::from_fn(|i| self.taken[i].iter().copied().collect())
    }

    /// Times holding `lists` (in [`ALL`]'s order), each path's last [`Times::KEPT`].
    pub fn from_lists(lists: &[Vec<Millis>; 4]) -> Times {
        let mut times = Times::default();
        for (rate, list) in ALL.into_iter().zip(lists) {
            for ms in list {
                times.record(rate, *ms);
            }
        }
        times
    }

    /// What an attempt on `rate` is expected to take, once there are [`Times::ENOUGH`] of its
    /// kept times: for the standard and priority paths, their 90th percentile; for flex, the
    /// longest (a cheaper path is taken only where its slowest seen still leaves room for the
    /// standard call after it: a slow flex call is not refused, it runs into the deadline). A
    /// batch is never expected sooner than its completion window: its lines end together, so
    /// they are few samples however many, and a line still running cannot be moved to another
    /// path (the worker's measure of a batch would take its usual hour for its worst).
    pub fn expected(&self, rate: Rate) -> Option<Millis> {
        let taken = &self.taken[index(rate)];
        if rate == Rate::Batch || taken.len() < Self::ENOUGH {
            return None;
        }
        let mut sorted: Vec<Millis> = taken.iter().copied().collect();
        sorted.sort_unstable();
        let at = match rate {
            Rate::Flex => sorted.len(),
            _ => (sorted.len() * 9).div_ceil(10),
        };
        sorted.get(at - 1).copied()
    }
}

/// The path the worker chose for `job`'s current attempt, if it chose one.
pub fn of(job: &super::JobItem) -> Option<Rate> {
    let route = job.attempt_log.last()?.route.as_ref()?;
    route.path.as_ref().map(|(rate, _)| *rate)
}

/// One path offered for an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// The path.
    pub rate: Rate,
    /// What the attempt is expected to cost on it, micro-dollars.
    pub cost_micros: u64,
    /// How long it is expected to take to an answer, from the claim.
    pub takes_ms: Millis,
}

/// The path chosen for an attempt, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The path.
    pub rate: Rate,
    /// Why, in a few words (recorded on the attempt).
    pub why: String,
}

/// What [`choose`] knows of the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wants {
    /// Time left before the job's deadline, less the skew margin.
    pub left_ms: Millis,
    /// The job is urgent: the only kind the chooser sends at priority.
    pub urgent: bool,
    /// The path the job asks for itself, if any.
    pub asked: Option<Rate>,
}

/// The path of an attempt among `offers`: the one the job asked for if it is offered; else the
/// cheapest that ends in time with room for one standard call after it (should it be refused
/// or fail), the faster of two that cost the same; else the fastest (priority, for an urgent
/// job). Priority is taken for urgent jobs only, and the standard path when nothing is
/// offered.
pub fn choose(offers: &[Offer], wants: Wants) -> Choice {
    if let Some(asked) = wants.asked
        && offers.iter().any(|o| o.rate == asked)
    {
        return Choice {
            rate: asked,
            why: format!("asked for {}", name(asked)),
        };
    }
    let offers: Vec<&Offer> = offers
        .iter()
        .filter(|o| o.rate != Rate::Priority || wants.urgent)
        .collect();
    let standard = offers
        .iter()
        .find(|o| o.rate == Rate::Standard)
        .map_or(0, |o| o.takes_ms);
    let in_time = |o: &&&Offer| {
        let after = if o.rate == Rate::Standard {
            0
        } else {
            standard
        };
        o.takes_ms.saturating_add(after) <= wants.left_ms
    };
    if let Some(best) = offers
        .iter()
        .filter(in_time)
        .min_by_key(|o| (o.cost_micros, o.takes_ms))
    {
        return Choice {
            rate: best.rate,
            why: format!(
                "the cheapest of {} that ends in time ({} s expected, {} s left)",
                offers.iter().filter(in_time).count(),
                best.takes_ms / 1_000,
                wants.left_ms.max(0) / 1_000
            ),
        };
    }
    // Nothing ends in time: an urgent job takes priority, whose capacity is kept ahead of the
    // standard's; any other the fastest.
    let fastest = offers
        .iter()
        .find(|o| o.rate == Rate::Priority)
        .or_else(|| offers.iter().min_by_key(|o| (o.takes_ms, o.cost_micros)));
    match fastest {
        Some(fastest) => Choice {
            rate: fastest.rate,
            why: format!(
                "none ends in time ({} s left): the fastest",
                wants.left_ms.max(0) / 1_000
            ),
        },
        None => Choice {
            rate: Rate::Standard,
            why: "nothing else offered".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Millis = 60_000;

    fn offers() -> Vec<Offer> {
        vec![
            Offer {
                rate: Rate::Batch,
                cost_micros: 500,
                takes_ms: 24 * 60 * MIN,
            },
            Offer {
                rate: Rate::Flex,
                cost_micros: 500,
                takes_ms: 15 * MIN,
            },
            Offer {
                rate: Rate::Standard,
                cost_micros: 1_000,
                takes_ms: 2 * MIN,
            },
            Offer {
                rate: Rate::Priority,
                cost_micros: 1_800,
                takes_ms: MIN,
            },
        ]
    }

    fn wants(left_ms: Millis) -> Wants {
        Wants {
            left_ms,
            urgent: false,
            asked: None,
        }
    }

    #[test]
    fn the_cheapest_path_that_ends_in_time_with_room_for_a_standard_call_is_taken() {
        // Two days: the batch and flex cost the same, and flex is faster.
        assert_eq!(choose(&offers(), wants(48 * 60 * MIN)).rate, Rate::Flex);
        let no_flex: Vec<Offer> = offers()
            .into_iter()
            .filter(|o| o.rate != Rate::Flex)
            .collect();
        assert_eq!(choose(&no_flex, wants(48 * 60 * MIN)).rate, Rate::Batch);
        // A day: the batch's 24 hours leave no room for a standard call after it.
        assert_eq!(choose(&no_flex, wants(24 * 60 * MIN)).rate, Rate::Standard);
        // Seventeen minutes: flex and a standard call after it fit exactly; sixteen do not.
        assert_eq!(choose(&offers(), wants(17 * MIN)).rate, Rate::Flex);
        assert_eq!(choose(&offers(), wants(16 * MIN)).rate, Rate::Standard);
    }

    #[test]
    fn priority_is_for_urgent_jobs_and_the_fastest_goes_when_nothing_fits() {
        // Ninety seconds: nothing ends in time; a job that is not urgent gets the standard
        // call, an urgent one priority.
        let choice = choose(&offers(), wants(90_000));
        assert_eq!(choice.rate, Rate::Standard);
        assert!(choice.why.contains("none ends in time"), "{}", choice.why);
        let urgent = Wants {
            urgent: true,
            ..wants(90_000)
        };
        assert_eq!(choose(&offers(), urgent).rate, Rate::Priority);
        // Time enough: even an urgent job takes the cheapest path.
        let urgent = Wants {
            urgent: true,
            ..wants(48 * 60 * MIN)
        };
        assert_eq!(choose(&offers(), urgent).rate, Rate::Flex);
        assert_eq!(choose(&[], wants(MIN)).rate, Rate::Standard);
    }

    #[test]
    fn a_path_the_job_asks_for_is_taken_when_it_is_offered() {
        let asked = Wants {
            asked: Some(Rate::Batch),
            ..wants(5 * MIN)
        };
        let choice = choose(&offers(), asked);
        assert_eq!(
            (choice.rate, choice.why.as_str()),
            (Rate::Batch, "asked for batch")
        );
        let standard_only: Vec<Offer> = offers()
            .into_iter()
            .filter(|o| o.rate == Rate::Standard)
            .collect();
        assert_eq!(choose(&standard_only, asked).rate, Rate::Standard);
    }

    #[test]
    fn a_paths_expected_time_is_its_90th_percentile_flexs_its_longest_once_there_are_enough() {
        let mut times = Times::default();
        for ms in 1..Times::ENOUGH as Millis {
            times.record(Rate::Standard, ms * 1_000);
            times.record(Rate::Flex, ms * 1_000);
        }
        assert_eq!(times.expected(Rate::Standard), None, "seven are not enough");
        assert_eq!(times.expected(Rate::Flex), None);
        for _ in 0..Times::KEPT {
            times.record(Rate::Standard, 2_000);
        }
        assert_eq!(
            times.expected(Rate::Standard),
            Some(2_000),
            "only the last are kept"
        );
        // Ten of 32: 1 s, then 100 s; the 90th percentile is the 29th.
        for i in 0..Times::KEPT as Millis {
            let ms = if i < 22 { 1_000 } else { 100_000 + i };
            times.record(Rate::Standard, ms);
            times.record(Rate::Flex, ms);
        }
        assert_eq!(times.expected(Rate::Standard), Some(100_028));
        // Flex's is its slowest.
        assert_eq!(times.expected(Rate::Flex), Some(100_031));
        // A batch's is never measured below its window, however fast its lines came.
        for _ in 0..Times::KEPT {
            times.record(Rate::Batch, 60_000);
        }
        assert_eq!(times.expected(Rate::Batch), None);
    }

    #[test]
    fn paths_parse_with_the_standard_path_always_allowed() {
        let paths = Paths::parse("batch, flex").expect("paths");
        assert!(paths.allows(Rate::Batch) && paths.allows(Rate::Flex));
        assert!(
            paths.allows(Rate::Standard),
            "where a job goes when nothing fits"
        );
        assert!(!paths.allows(Rate::Priority));
        assert!(!Paths::parse("").expect("none").any());
        assert!(Paths::parse("fast").is_err());
        assert_eq!(ALL.map(|r| parse(name(r))), ALL.map(Some));
    }
}
