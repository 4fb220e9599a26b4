//! [`Ledger`]: a run's usage figures and its entries, one per model call of
//! the run and of the runs nested in it. An entry names its run, agent and
//! model by their place in the ledger's lists of names, so recording a call
//! shares no name: a name is kept once, when the ledger first meets it, and
//! [`UsageEntry`]s are made only when read.

use std::sync::Arc;

use super::UsageEntry;
use crate::types::{Cost, ModelName, PriceTable, Usage};

#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// What [`RunContext::set_prices`](super::RunContext::set_prices) set:
    /// kept with the figures it prices (a run that prices nothing holds no
    /// room for it).
    pub(super) prices: Option<Arc<PriceTable>>,
    pub(super) own: Usage,
    pub(super) total: Usage,
    pub(super) own_cost: Option<Cost>,
    pub(super) total_cost: Option<Cost>,
    entries: Vec<Kept>,
    names: Names,
}

/// One entry, its names by index.
#[derive(Debug)]
struct Kept {
    /// Into `Names::runs`; `None`: the ledger's own run.
    run: Option<u32>,
    /// Into `Names::agents`.
    agent: Option<u32>,
    /// Into `Names::models`.
    model: u32,
    usage: Usage,
    cost: Option<Cost>,
}

/// The names a ledger's entries use, each kept once.
#[derive(Debug, Default)]
struct Names {
    runs: NameList<Arc<str>>,
    agents: NameList<Arc<str>>,
    models: NameList<ModelName>,
}

/// A list of names, the first inline: a run meets one agent and one model,
/// and keeps them without allocating a list.
#[derive(Debug)]
struct NameList<T> {
    first: Option<T>,
    rest: Vec<T>,
}

impl<T> Default for NameList<T> {
    fn default() -> Self {
        Self {
            first: None,
            rest: Vec::new(),
        }
    }
}

/// How many of the names last kept are looked at before a name is kept
/// again: a ledger with many nested runs keeps a name twice rather than
/// search them all.
const LOOK_BACK: usize = 4;

impl<T: AsRef<str> + Clone> NameList<T> {
    fn get(&self, at: u32) -> &T {
        match at.checked_sub(1) {
            None => self.first.as_ref().expect("index 0 is the first name"),
            Some(i) => &self.rest[i as usize],
        }
    }

    /// The index of `name`: the first name, or one of the last few, or
    /// kept now.
    #[inline]
    fn index_of(&mut self, name: &T) -> u32 {
        let wanted = name.as_ref();
        let same = |kept: &T| {
            let kept = kept.as_ref();
            std::ptr::eq(kept, wanted) || kept == wanted
        };
        let Some(first) = &self.first else {
            self.first = Some(name.clone());
            return 0;
        };
        if same(first) {
            return 0;
        }
        let from = self.rest.len().saturating_sub(LOOK_BACK);
        let at = match self.rest[from..].iter().rposition(same) {
            Some(at) => from + at + 1,
            None => {
                self.rest.push(name.clone());
                self.rest.len()
            }
        };
        // A ledger holds fewer names than it has entries, far fewer than
        // `u32::MAX`.
        at as u32
    }
}

impl Ledger {
    /// Adds one call of this ledger's own run (of `agent`) to its own
    /// figures and its total.
    pub(super) fn add_own(
        &mut self,
        agent: Option<&Arc<str>>,
        model: &ModelName,
        usage: Usage,
        cost: Option<Cost>,
    ) {
        self.own += usage;
        if let Some(cost) = cost {
            *self.own_cost.get_or_insert(Cost::ZERO) += cost;
        }
        let agent = agent.map(|agent| self.names.agents.index_of(agent));
        let model = self.names.models.index_of(model);
        self.keep(Kept {
            run: None,
            agent,
            model,
            usage,
            cost,
        });
    }

    /// Adds one call of a run nested in this ledger's to its total.
    pub(super) fn add_nested(&mut self, entry: &UsageEntry) {
        let run = Some(self.names.runs.index_of(&entry.run_id));
        let agent = entry
            .agent
            .as_ref()
            .map(|agent| self.names.agents.index_of(agent));
        let model = self.names.models.index_of(&entry.model);
        self.keep(Kept {
            run,
            agent,
            model,
            usage: entry.usage,
            cost: entry.cost,
        });
    }

    fn keep(&mut self, kept: Kept) {
        self.total += kept.usage;
        if let Some(cost) = kept.cost {
            *self.total_cost.get_or_insert(Cost::ZERO) += cost;
        }
        self.entries.push(kept);
    }

    /// The entries, in the order they were recorded; `own` is the run id of
    /// the ledger's run.
    pub(super) fn entries(&self, own: &Arc<str>) -> Vec<UsageEntry> {
        let names = &self.names;
        self.entries
            .iter()
            .map(|kept| UsageEntry {
                run_id: kept
                    .run
                    .map_or_else(|| own.clone(), |at| names.runs.get(at).clone()),
                agent: kept.agent.map(|at| names.agents.get(at).clone()),
                model: names.models.get(kept.model).clone(),
                usage: kept.usage,
                cost: kept.cost,
            })
            .collect()
    }
}
