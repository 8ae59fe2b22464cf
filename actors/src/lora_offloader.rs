//! LoraOffloader: LoRA adapters attached to base weights, with their own accounting.
//!
//! This is the mailbox and the bookkeeping; applying factors to streamed and resident
//! weights is the LoRA work that builds on it. LoRA bytes are counted apart from model
//! bytes so "loaded" never reads more than the model's size.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;

use crate::messages::Reply;
use crate::observer::Observer;

/// An adapter's factors, as far as the budgets are concerned.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterSummary {
    pub name: String,
    pub strength: f32,
    pub bytes: u64,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Attach(pub AdapterSummary);

#[derive(Message)]
#[rtype(result = "()")]
pub struct Detach(pub String);

#[derive(Message)]
#[rtype(result = "()")]
pub struct Attached(pub Reply<Vec<AdapterSummary>>);

pub struct LoraOffloader {
    adapters: BTreeMap<String, AdapterSummary>,
    #[allow(dead_code)]
    observer: Arc<dyn Observer>,
}

impl LoraOffloader {
    pub fn new(observer: Arc<dyn Observer>) -> Self {
        Self {
            adapters: BTreeMap::new(),
            observer,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.adapters.values().map(|adapter| adapter.bytes).sum()
    }
}

impl Actor for LoraOffloader {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(64);
    }
}

impl Handler<Attach> for LoraOffloader {
    type Result = ();

    fn handle(&mut self, message: Attach, _ctx: &mut Self::Context) {
        self.adapters.insert(message.0.name.clone(), message.0);
    }
}

impl Handler<Detach> for LoraOffloader {
    type Result = ();

    fn handle(&mut self, message: Detach, _ctx: &mut Self::Context) {
        self.adapters.remove(&message.0);
    }
}

impl Handler<Attached> for LoraOffloader {
    type Result = ();

    fn handle(&mut self, message: Attached, _ctx: &mut Self::Context) {
        let _ = message.0.send(self.adapters.values().cloned().collect());
    }
}
