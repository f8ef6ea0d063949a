//! The built-in contracts, and an answer the built-in `invoice-extract@2` contract accepts, for
//! the contract tests of both binaries.

use fenced_jobs::job::contract::Contracts;
use serde_json::{Value, json};

/// An answer the built-in `invoice-extract@2` contract accepts.
pub fn invoice() -> Value {
    let party =
        |name: &str| json!({"name": name, "vat_id": null, "address": null, "country": "FR"});
    json!({
        "number": "INV-1", "issued": "2026-11-30", "due": "2026-12-30", "currency": "EUR",
        "seller": party("Seller"), "buyer": party("Buyer"), "purchase_order": null,
        "lines": [{"description": "consulting", "quantity": 2, "unit_price": 50.0,
                   "amount": 100.0, "tax_rate": 0.2, "sku": null}],
        "subtotal": 100.0, "tax": 20.0, "total": 120.0, "paid": false,
        "payment_terms": "30 days", "notes": null
    })
}

pub fn built_in(strict: bool) -> Contracts {
    Contracts::with_built_in(&[], strict).expect("the built-in contracts compile")
}
