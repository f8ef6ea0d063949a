//! Who pays and who waits: every job is accounted under its producer's and its tenant's names
//! together, and what a producer may label its jobs with is the deployment's to say.
//!
//! A job's tenant is a label its producer writes, so on its own it decides nothing: the day's
//! spend, the pacing share, the event's `tenant` and the exports all take the job's *account*,
//! `<producer>/<tenant>`, where the producer is the namespace of the job's whole id (from the
//! sender SQS names, never from the message). The unnamed producer's account is the tenant
//! alone, as its job ids are: a named producer's account always holds a `/` and a tenant never
//! does, so no producer can reach another's. A job without a tenant is accounted under
//! [`NO_TENANT`], which no tenant can be named (a tenant has no parentheses): leaving the label
//! out is no way around a tenant's limits.
//!
//! `PRODUCER_TENANTS` lists the tenants a producer may name (`billing=acme|globex`); a job of
//! that producer naming another is poison with its reason. `URGENT_PRODUCERS` lists the
//! producers that may send `priority: urgent`; an urgent job from any other is poison with its
//! reason. Unset, each allows everything.

use std::collections::{BTreeMap, BTreeSet};

use super::policy::Policy;
use super::scope::{Producers, Sender, producer_of};
use super::{InvalidMessage, JobMessage, Millis};

/// Whose a job is and how urgent: which queue its triggers go to, which message group (fair
/// queue) they are in, and whose shares and limits its calls draw on. Not part of the digest:
/// kept by the first write that creates the item, as the metadata.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct JobClass {
    /// The message's `tenant`: its triggers' `MessageGroupId` on a standard queue (SQS fair
    /// queues), its own spend limit, its label in events and exports.
    pub tenant: Option<String>,
    /// `priority: "urgent"`: its triggers go to the urgent queue, whose event source mapping
    /// polls beside the backlog, and its calls draw on the reserved share of the paced
    /// capacity.
    pub urgent: bool,
}

impl JobClass {
    /// The `priority` a message and an item name it by.
    pub fn priority(&self) -> &'static str {
        if self.urgent { "urgent" } else { "normal" }
    }
}

/// The tenant a job without one is accounted under.
pub const NO_TENANT: &str = "(none)";

/// The account of the job `job_id` (its whole id) labelled `tenant`.
pub fn account(job_id: &str, tenant: Option<&str>) -> String {
    let tenant = tenant.unwrap_or(NO_TENANT);
    match producer_of(job_id) {
        Some(producer) => format!("{producer}/{tenant}"),
        None => tenant.to_owned(),
    }
}

/// What the deployment lets each producer label its jobs with: its tenants
/// (`PRODUCER_TENANTS`) and the right to send urgent jobs (`URGENT_PRODUCERS`). The unnamed
/// producer is written with an empty name (`=acme`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Labels {
    /// Each listed producer's tenants; a producer not listed may name any.
    tenants: BTreeMap<String, BTreeSet<String>>,
    /// The producers that may send urgent jobs; `None`: every producer.
    urgent: Option<BTreeSet<String>>,
}

impl Labels {
    /// The rules from `PRODUCER_TENANTS` (`name=TENANT|TENANT,...`) and `URGENT_PRODUCERS`
    /// (`name,...`, `-` for none), each producer among `producers` (the names `PRODUCERS`
    /// gives, the unnamed one as empty).
    pub fn parse(tenants: &str, urgent: &str, producers: &[&str]) -> Result<Labels, String> {
        let known = |name: &str| {
            if producers.contains(&name) {
                Ok(())
            } else {
                Err(format!("{name:?} is not a producer PRODUCERS names"))
            }
        };
        let mut by_producer = BTreeMap::new();
        for entry in entries(tenants) {
            let Some((name, list)) = entry.split_once('=') else {
                return Err(format!("{entry:?}: expected producer=TENANT|TENANT"));
            };
            let name = name.trim();
            known(name)?;
            let list: BTreeSet<String> = list.split('|').map(|t| t.trim().to_owned()).collect();
            if let Some(bad) = list.iter().find(|t| !is_tenant(t)) {
                return Err(format!(
                    "{bad:?}: a tenant is 1 to 64 letters, digits and _ - . : @"
                ));
            }
            if by_producer.insert(name.to_owned(), list).is_some() {
                return Err(format!("{name:?} is listed twice"));
            }
        }
        let urgent = match urgent.trim() {
            "" => None,
            "-" => Some(BTreeSet::new()),
            list => {
                let names: BTreeSet<String> = entries(list).map(str::to_owned).collect();
                for name in &names {
                    known(name).map_err(|e| format!("URGENT_PRODUCERS: {e}"))?;
                }
                Some(names)
            }
        };
        Ok(Labels {
            tenants: by_producer,
            urgent,
        })
    }

    /// Why the job `job_id` (its whole id) may not carry these labels, if it may not: a tenant
    /// its producer's list lacks, or `urgent` from a producer not allowed it.
    pub fn refusal(
        &self,
        job_id: &str,
        tenant: Option<&str>,
        urgent: bool,
    ) -> Option<InvalidMessage> {
        let producer = producer_of(job_id).unwrap_or("");
        let listed = self.tenants.get(producer);
        if let (Some(list), Some(tenant)) = (listed, tenant)
            && !list.contains(tenant)
        {
            return Some(InvalidMessage::NotAllowed {
                field: "tenant".to_owned(),
                rule: "not among the producer's tenants (PRODUCER_TENANTS)",
            });
        }
        if urgent && self.urgent.as_ref().is_some_and(|u| !u.contains(producer)) {
            return Some(InvalidMessage::NotAllowed {
                field: "priority".to_owned(),
                rule: "the producer may not send urgent jobs (URGENT_PRODUCERS)",
            });
        }
        None
    }
}

/// What a deployment holds every producer's job to at its first sight, whoever brings it in
/// (the worker, `jobctl submit`): the producers and the namespace of each (`PRODUCERS`), the
/// labels each may use ([`Labels`]) and what any job may ask for ([`Policy`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProducerRules {
    /// Who may send jobs, and each producer's namespace.
    pub producers: Producers,
    /// The tenants and the priority each producer may label its jobs with.
    pub labels: Labels,
    /// The models, parameters, attempts and deadlines a job may ask for.
    pub policy: Policy,
}

impl ProducerRules {
    /// Why `msg` (its whole id, as scoped) is refused at `now`, if it is: what it asks for,
    /// then how it is labelled.
    pub fn refusal(&self, msg: &JobMessage, now: Millis) -> Option<InvalidMessage> {
        refusal(&self.policy, &self.labels, msg, now)
    }

    /// The whole id of a job an operator names `job_id` (a trusted sender's word, without a
    /// producer's namespace of its own): as it is, when no producer is named; with them, a
    /// named producer's whole id or an id of the unnamed producer's, never an unknown
    /// producer's.
    pub fn operators_job_id(&self, job_id: &str) -> Result<String, InvalidMessage> {
        let sender = match self.producers.scoped() {
            true => Sender::Trusted,
            false => Sender::Anyone,
        };
        self.producers.job_id(sender, job_id, None)
    }
}

/// Why `msg` (its whole id, as scoped) is refused at `now` by `policy` (what it asks for) or
/// `labels` (how its producer labelled it), if it is: the one judgement of a job's first
/// sight that the worker and `jobctl submit` share.
pub fn refusal(
    policy: &Policy,
    labels: &Labels,
    msg: &JobMessage,
    now: Millis,
) -> Option<InvalidMessage> {
    policy.refusal(msg, now).or_else(|| {
        let class = &msg.class;
        labels.refusal(&msg.job_id, class.tenant.as_deref(), class.urgent)
    })
}

fn entries(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|e| !e.is_empty())
}

/// Whether `name` is a tenant a message may carry (see [`super::message`]).
fn is_tenant(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '@'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_is_accounted_with_its_producer_and_no_producer_reaches_anothers() {
        assert_eq!(account("billing/job-1", Some("acme")), "billing/acme");
        assert_eq!(account("search/job-1", Some("acme")), "search/acme");
        // The unnamed producer's tenant alone: never a named producer's, which holds a `/`.
        assert_eq!(account("job-1", Some("acme")), "acme");
        // No tenant: a key no tenant can take, per producer.
        assert_eq!(account("billing/job-1", None), "billing/(none)");
        assert_eq!(account("job-1", None), "(none)");
        assert!(!is_tenant(NO_TENANT));
    }

    /// SQS's `SendMessage`: a `MessageGroupId` is at most 128 characters, "alphanumeric
    /// characters and punctuation (!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~)" (the API reference's
    /// words), which the account of every job must be, as its triggers carry it.
    #[test]
    fn every_account_is_a_message_group_id_sqs_takes() {
        let group_id = |g: &str| {
            (1..=128).contains(&g.len())
                && g.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c.is_ascii_punctuation())
        };
        // The longest producer name (32) and tenant (64), and every character either may hold.
        let producer = "p".repeat(31) + "-";
        let tenant = "t".repeat(59) + "_-.:@";
        for job_id in [format!("{producer}/job"), "job".to_owned()] {
            for tenant in [Some(tenant.as_str()), None] {
                let a = account(&job_id, tenant);
                assert!(group_id(&a), "{a:?}");
            }
        }
    }

    #[test]
    fn a_producer_names_only_its_tenants_and_sends_urgent_jobs_only_when_allowed() {
        let labels = Labels::parse(
            "billing=acme|globex,=internal",
            "billing",
            &["billing", "search", ""],
        )
        .expect("parsed");
        assert_eq!(labels.refusal("billing/j", Some("acme"), true), None);
        assert_eq!(labels.refusal("billing/j", None, false), None);
        let refused = labels.refusal("billing/j", Some("initech"), false);
        assert!(
            matches!(refused, Some(InvalidMessage::NotAllowed { field, .. }) if field == "tenant")
        );
        // A producer with no list names any tenant, but sends no urgent job.
        assert_eq!(labels.refusal("search/j", Some("acme"), false), None);
        let refused = labels.refusal("search/j", None, true);
        assert!(
            matches!(refused, Some(InvalidMessage::NotAllowed { field, .. }) if field == "priority")
        );
        // The unnamed producer's list.
        assert!(labels.refusal("j", Some("acme"), false).is_some());
        assert_eq!(labels.refusal("j", Some("internal"), false), None);
        // Unset: everything allowed; `-`: no producer sends urgent jobs.
        let open = Labels::parse("", "", &[]).expect("parsed");
        assert_eq!(open.refusal("billing/j", Some("x"), true), None);
        let none = Labels::parse("", "-", &[]).expect("parsed");
        assert!(none.refusal("j", None, true).is_some());
        // Names PRODUCERS does not give, and bad tenants, stop start-up.
        assert!(Labels::parse("other=acme", "", &["billing"]).is_err());
        assert!(Labels::parse("billing=a/b", "", &["billing"]).is_err());
        assert!(Labels::parse("", "other", &["billing"]).is_err());
    }
}
