//! Producers kept apart: each job id lives in its producer's namespace (`billing/job-1`), and
//! the producer is known from the principal SQS says sent the message (`SenderId`), which a
//! producer cannot choose, never from anything in the message.
//!
//! Without `PRODUCERS` a deployment has one producer and ids are used as they come. With it:
//! a message from a listed producer names its job by the producer's own id, which the worker
//! scopes (`job-1` from `billing` is the job `billing/job-1`), and a pointer it sends must name
//! a key under the producer's prefix (`billing/`); a message from one of `TRUSTED_SENDERS` (the
//! reconciler's role, operators) names jobs by their whole id; any other sender is refused.
//! One producer may be listed without a name (`=AROA...`): its ids stay as they come, so a
//! deployment that had one producer keeps its jobs when it takes more; no other producer's ids
//! and keys can meet its own, which have no `/`.

use std::collections::BTreeMap;

use super::InvalidMessage;
use super::message::MAX_JOB_ID_LEN;

/// The keys the worker keeps stored answers and inputs under: no producer is named after them,
/// and no pointer names a key under them.
const RESERVED_PREFIXES: [&str; 2] = [
    super::artifact::RESULTS_PREFIX,
    super::artifact::INPUTS_PREFIX,
];

/// Who may send jobs, and the namespace of each.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Producers {
    /// `PRODUCERS`: each sender's principal id (an IAM role's or user's unique id) and the
    /// producer it is. Empty: one producer, no namespaces.
    by_sender: BTreeMap<String, String>,
    /// `TRUSTED_SENDERS`: principal ids that name jobs by their whole id.
    trusted: Vec<String>,
}

/// Who sent a message, as far as the worker is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender<'a> {
    /// No namespaces: the deployment's one producer.
    Anyone,
    /// A listed producer: its jobs live under its name.
    Producer(&'a str),
    /// A trusted sender: it names jobs by their whole id.
    Trusted,
}

impl Producers {
    /// Producers from `name=ID|ID,...` and trusted senders from `ID,...` (either may be empty).
    pub fn parse(producers: &str, trusted: &str) -> Result<Producers, String> {
        let mut by_sender = BTreeMap::new();
        for entry in producers
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let Some((name, ids)) = entry.split_once('=') else {
                return Err(format!("{entry:?}: expected name=PRINCIPAL_ID"));
            };
            let name = name.trim();
            if name.len() > 32
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!(
                    "{name:?}: a producer's name is up to 32 characters from A-Z a-z 0-9 _ - (none: ids unscoped)"
                ));
            }
            if RESERVED_PREFIXES
                .iter()
                .any(|r| r.strip_suffix('/') == Some(name))
            {
                return Err(format!(
                    "{name:?} is reserved: the worker keeps answers and inputs under it"
                ));
            }
            for id in ids.split('|').map(str::trim) {
                check_principal(id)?;
                if by_sender.insert(id.to_owned(), name.to_owned()).is_some() {
                    return Err(format!("{id:?} is listed twice"));
                }
            }
        }
        let mut list = Vec::new();
        for id in trusted.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            check_principal(id)?;
            if by_sender.contains_key(id) {
                return Err(format!("{id:?} is both a producer and trusted"));
            }
            list.push(id.to_owned());
        }
        Ok(Producers {
            by_sender,
            trusted: list,
        })
    }

    /// Whether the principal of `sender_id` (`ROLE_ID:session`) is one of `TRUSTED_SENDERS`,
    /// whether or not producers are kept apart: jobctl believes the worker's words on a dead
    /// letter only from these.
    pub(crate) fn trusts(&self, sender_id: Option<&str>) -> bool {
        let principal = sender_id.map(|s| s.split_once(':').map_or(s, |(id, _)| id));
        principal.is_some_and(|p| self.trusted.iter().any(|t| t == p))
    }

    /// Whether producers are kept apart at all.
    pub(crate) fn scoped(&self) -> bool {
        !self.by_sender.is_empty()
    }

    /// The sender of a message whose SQS `SenderId` is `sender_id` (for an assumed role,
    /// `ROLE_ID:session`; the role's id is what counts). Refused: a sender the deployment does
    /// not list, once it lists any.
    pub fn sender(&self, sender_id: Option<&str>) -> Result<Sender<'_>, InvalidMessage> {
        if !self.scoped() {
            return Ok(Sender::Anyone);
        }
        let principal = sender_id.map(|s| s.split_once(':').map_or(s, |(id, _)| id));
        if let Some(name) = principal.and_then(|p| self.by_sender.get(p)) {
            return Ok(Sender::Producer(name));
        }
        if principal.is_some_and(|p| self.trusted.iter().any(|t| t == p)) {
            return Ok(Sender::Trusted);
        }
        Err(InvalidMessage::NotAllowed {
            field: "SenderId".to_owned(),
            rule: "the sender is neither among PRODUCERS nor TRUSTED_SENDERS",
        })
    }

    /// The whole id of the job a message from `sender` names `job_id`. `named` is the whole id
    /// the message's `fenced-jobs.job-id` attribute gives, which only a trusted sender's message
    /// is believed on: a dead letter the worker wrote carries it, so that an operator's redrive
    /// of a producer's original body reaches that producer's job. A trusted sender's id without
    /// `/` is the unnamed producer's (or a job from before producers were listed).
    pub fn job_id(
        &self,
        sender: Sender<'_>,
        job_id: &str,
        named: Option<&str>,
    ) -> Result<String, InvalidMessage> {
        let scoped = job_id.split_once('/');
        if let (Sender::Trusted, None, Some(whole)) = (sender, scoped, named)
            && whole_id(job_id, whole).is_some_and(|p| self.named(p))
        {
            return Ok(whole.to_owned());
        }
        if scoped.is_none() && self.named(job_id) {
            // The unnamed producer's job `billing` would keep its answers and inputs under the
            // prefixes of the producer `billing` (`results/billing/...`).
            return Err(reserved(
                "a job id of the unnamed producer is never a producer's name",
            ));
        }
        match (sender, scoped) {
            (Sender::Anyone, None) => Ok(job_id.to_owned()),
            (Sender::Anyone, Some(_)) => {
                Err(reserved("`/` separates producers, and PRODUCERS is unset"))
            }
            (Sender::Producer(""), None) => Ok(job_id.to_owned()),
            (Sender::Producer(name), None) if name.len() + 1 + job_id.len() > MAX_JOB_ID_LEN => {
                Err(reserved(
                    "with the producer's name and `/` before it, a job id is at most 128 characters",
                ))
            }
            (Sender::Producer(name), None) => Ok(format!("{name}/{job_id}")),
            (Sender::Producer(_), Some(_)) => Err(reserved(
                "a producer names its jobs by its own ids, without `/`",
            )),
            (Sender::Trusted, Some((name, _))) if self.named(name) => Ok(job_id.to_owned()),
            (Sender::Trusted, None) => Ok(job_id.to_owned()),
            (Sender::Trusted, _) => Err(reserved(
                "a trusted sender names a producer's job by its whole id",
            )),
        }
    }

    /// Whether a pointer from `sender` may name the object `key`: a producer's only under its
    /// own prefix (`billing/`), so that no producer can have another's offloaded job read; the
    /// unnamed producer's under no other producer's prefix. A trusted sender's pointer (an
    /// operator's redrive) is held to the rule of the producer whose job it names (`named`,
    /// the message's `fenced-jobs.job-id`). No pointer names a key the worker keeps answers or
    /// inputs under, nor one with a `.` or `..` segment.
    pub(crate) fn may_read(&self, sender: Sender<'_>, key: &str, named: Option<&str>) -> bool {
        if RESERVED_PREFIXES.iter().any(|r| key.starts_with(r))
            || key.split('/').any(|part| part == "." || part == "..")
        {
            return false;
        }
        let under = |name: &str| {
            key.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('/'))
        };
        match sender {
            Sender::Producer("") => !self.by_sender.values().any(|n| !n.is_empty() && under(n)),
            Sender::Producer(name) => under(name),
            Sender::Trusted => {
                let owner = named.and_then(producer_of).filter(|p| self.named(p));
                self.may_read(Sender::Producer(owner.unwrap_or("")), key, None)
            }
            Sender::Anyone => true,
        }
    }

    /// The producers' names, the unnamed one (the deployment's only one without `PRODUCERS`)
    /// as empty.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.by_sender.values().map(String::as_str).collect();
        names.push("");
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Whether `name` is a listed producer with a namespace.
    fn named(&self, name: &str) -> bool {
        !name.is_empty() && self.by_sender.values().any(|n| n == name)
    }
}

/// The producer of `whole` when it is `job_id` in a producer's namespace (`billing/job-1` for
/// `job-1`).
pub(crate) fn whole_id<'a>(job_id: &str, whole: &'a str) -> Option<&'a str> {
    let (producer, id) = whole.split_once('/')?;
    (id == job_id).then_some(producer)
}

/// The producer a whole job id names (`billing` of `billing/job-1`), if it has one.
pub(crate) fn producer_of(job_id: &str) -> Option<&str> {
    job_id.split_once('/').map(|(producer, _)| producer)
}

fn reserved(rule: &'static str) -> InvalidMessage {
    InvalidMessage::NotAllowed {
        field: "job_id".to_owned(),
        rule,
    }
}

fn check_principal(id: &str) -> Result<(), String> {
    // IAM unique ids (AROA..., AIDA...) and account ids: letters and digits.
    if id.is_empty() || id.len() > 128 || !id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "{id:?}: a principal id is the role's or user's unique id (AROA..., AIDA...), letters and digits"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Producers {
        Producers::parse(
            "billing=AROABILLING, search=AROASEARCH|AIDASEARCHUSER",
            "AROARECONCILER",
        )
        .expect("parsed")
    }

    #[test]
    fn each_producer_names_its_own_jobs_only() {
        let p = two();
        let billing = p.sender(Some("AROABILLING:lambda-session")).expect("known");
        let search = p.sender(Some("AIDASEARCHUSER")).expect("known");
        assert_eq!(billing, Sender::Producer("billing"));
        assert_eq!(search, Sender::Producer("search"));
        // The same id from two producers is two jobs.
        assert_eq!(
            p.job_id(billing, "job-1", None).expect("scoped"),
            "billing/job-1"
        );
        assert_eq!(
            p.job_id(search, "job-1", None).expect("scoped"),
            "search/job-1"
        );
        // A producer cannot name another's job by its whole id.
        assert!(p.job_id(search, "billing/job-1", None).is_err());
        // Nor by the attribute that names a dead letter's job: only a trusted sender's counts.
        assert_eq!(
            p.job_id(search, "job-1", Some("billing/job-1"))
                .expect("its own"),
            "search/job-1"
        );
        // Trusted senders (the reconciler's re-sends) name whole ids, of known producers only.
        let trusted = p.sender(Some("AROARECONCILER:run")).expect("trusted");
        assert_eq!(
            p.job_id(trusted, "billing/job-1", None).expect("whole"),
            "billing/job-1"
        );
        assert!(p.job_id(trusted, "other/job-1", None).is_err());
        // An id without `/` from a trusted sender is a job of before producers were listed.
        assert_eq!(p.job_id(trusted, "job-1", None).expect("as is"), "job-1");
        // An operator's redrive of a producer's dead letter: the body's id, the letter's whole id.
        assert_eq!(
            p.job_id(trusted, "job-1", Some("billing/job-1"))
                .expect("redriven"),
            "billing/job-1"
        );
        assert_eq!(
            p.job_id(trusted, "job-1", Some("billing/job-2"))
                .expect("not that job's letter"),
            "job-1"
        );
        // No job of the unnamed producer's (no `/`) takes a producer's name, so none keeps its
        // objects under that producer's prefixes.
        let unnamed = Producers::parse("billing=AROABILLING,=AROAOLD", "").expect("parsed");
        let old = unnamed.sender(Some("AROAOLD")).expect("known");
        assert!(unnamed.job_id(old, "billing", None).is_err());
        assert_eq!(
            unnamed.job_id(old, "billing-2", None).expect("its own"),
            "billing-2"
        );
        assert!(p.job_id(trusted, "search", None).is_err());
        // Anyone else is refused, and so is a message SQS gave no sender.
        assert!(p.sender(Some("AROASTRANGER:x")).is_err());
        assert!(p.sender(None).is_err());
    }

    #[test]
    fn pointers_reach_only_the_producers_own_prefix() {
        let p = two();
        let billing = Sender::Producer("billing");
        assert!(p.may_read(billing, "billing/0f3c.json", None));
        assert!(!p.may_read(billing, "search/0f3c.json", None));
        assert!(!p.may_read(billing, "billing-old/0f3c.json", None));
        assert!(!p.may_read(billing, "0f3c.json", None));
        // A trusted sender's pointer (an operator's redrive) is held to the rule of the
        // producer whose job its letter names.
        let trusted = Sender::Trusted;
        assert!(p.may_read(trusted, "search/0f3c.json", Some("search/job-1")));
        assert!(!p.may_read(trusted, "search/0f3c.json", Some("billing/job-1")));
        assert!(!p.may_read(trusted, "search/0f3c.json", None));
        assert!(p.may_read(trusted, "0f3c.json", Some("job-1")));
        // No pointer reaches the worker's own keys, nor a key with a dot segment.
        assert!(!p.may_read(Sender::Anyone, "results/search/job-1/1/ab.json", None));
        assert!(!p.may_read(Sender::Anyone, "inputs/billing/job-1/cd.json", None));
        assert!(!p.may_read(billing, "billing/../search/0f3c.json", None));
        assert!(!p.may_read(billing, "billing/./0f3c.json", None));
        assert!(p.may_read(Sender::Anyone, "payloads/0f3c.json", None));
    }

    #[test]
    fn without_producers_ids_are_used_as_they_come() {
        let p = Producers::default();
        let anyone = p.sender(Some("AROAWHOEVER")).expect("anyone");
        assert_eq!(p.job_id(anyone, "job-1", None).expect("as is"), "job-1");
        assert!(p.job_id(anyone, "billing/job-1", None).is_err());
        assert_eq!(producer_of("billing/job-1"), Some("billing"));
        assert_eq!(producer_of("job-1"), None);
    }

    #[test]
    fn the_unnamed_producer_keeps_its_ids_and_meets_no_other() {
        let p = Producers::parse("=AROAFIRST,billing=AROABILLING", "").expect("parsed");
        let first = p.sender(Some("AROAFIRST:run")).expect("known");
        assert_eq!(first, Sender::Producer(""));
        assert_eq!(p.job_id(first, "job-1", None).expect("as is"), "job-1");
        assert!(p.job_id(first, "billing/job-1", None).is_err());
        assert!(p.may_read(first, "0f3c.json", None));
        assert!(p.may_read(first, "archive/0f3c.json", None));
        assert!(!p.may_read(first, "billing/0f3c.json", None));
        let billing = p.sender(Some("AROABILLING")).expect("known");
        assert!(!p.may_read(billing, "0f3c.json", None));
        assert_eq!(
            p.job_id(billing, "job-1", None).expect("scoped"),
            "billing/job-1"
        );
    }

    #[test]
    fn settings_that_cannot_be_meant_are_refused() {
        assert!(Producers::parse("billing", "").is_err());
        assert!(Producers::parse("bil ling=AROA1", "").is_err());
        assert!(Producers::parse("bil/ling=AROA1", "").is_err());
        assert!(Producers::parse("a=AROA1,b=AROA1", "").is_err());
        assert!(Producers::parse("a=AROA1", "AROA1").is_err());
        assert!(Producers::parse("a=arn:aws:iam::1:role/x", "").is_err());
        assert!(Producers::parse("results=AROA1", "").is_err());
        assert!(Producers::parse("inputs=AROA1", "").is_err());
    }

    #[test]
    fn a_scoped_id_fits_the_ledger_s_128_characters() {
        let p = two();
        let billing = Sender::Producer("billing");
        let longest = "j".repeat(128 - "billing/".len());
        assert_eq!(p.job_id(billing, &longest, None).expect("fits").len(), 128);
        assert!(p.job_id(billing, &format!("{longest}j"), None).is_err());
    }
}
