#pragma once

#include <vector>

#include "lib/sched/scheduler.h"
#include "server/store/job_store.h"

namespace dispatchd::dispatch {

// The scheduler's accounts as the store keeps them, and back (store::AccountRow names the kinds).
std::vector<store::AccountRow> ToAccountRows(const sched::FairAccounts& accounts);
// Rows of unknown kinds (written by a newer daemon) are left out.
sched::FairAccounts FromAccountRows(const std::vector<store::AccountRow>& rows);

}  // namespace dispatchd::dispatch
