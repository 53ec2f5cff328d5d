#include "server/dispatch/fair_accounts.h"

namespace dispatchd::dispatch {

std::vector<store::AccountRow> ToAccountRows(const sched::FairAccounts& accounts) {
  std::vector<store::AccountRow> rows;
  rows.reserve(1 + accounts.accounts.size() + accounts.estimates.size());
  rows.push_back({"clock", "", "", accounts.virtual_time});
  for (const sched::FairAccounts::Account& a : accounts.accounts) {
    if (a.key.empty()) {
      rows.push_back({"tenant", a.tenant, "", a.cost});
    } else {
      rows.push_back({"key", a.tenant, a.key, a.cost});
    }
  }
  for (const sched::FairAccounts::Estimate& e : accounts.estimates) {
    rows.push_back({"estimate", e.type, e.resource, e.cost});
  }
  return rows;
}

sched::FairAccounts FromAccountRows(const std::vector<store::AccountRow>& rows) {
  sched::FairAccounts out;
  for (const store::AccountRow& r : rows) {
    if (r.kind == "clock") {
      out.virtual_time = r.value;
    } else if (r.kind == "tenant") {
      out.accounts.push_back({r.a, "", r.value});
    } else if (r.kind == "key") {
      out.accounts.push_back({r.a, r.b, r.value});
    } else if (r.kind == "estimate") {
      out.estimates.push_back({r.a, r.b, r.value});
    }
  }
  return out;
}

}  // namespace dispatchd::dispatch
