# Simulation from the scheduler design document (the WFQ/conflict-exclusion design),
# re-indented from the document's appendix with no logic changes.
# Used to produce the golden output next to it (seed003_simulation.golden.txt).
from dataclasses import dataclass, field
from collections import defaultdict


@dataclass
class Job:
    job_type: str
    job_id: str
    fairness_key: str
    cost: int
    duration: int
    arrival_time: int = 0

    def __repr__(self):
        fk = self.fairness_key or "bg"
        return f"{self.job_type}({self.job_id}, fk={fk}, cost={self.cost}, dur={self.duration})"


@dataclass
class RunningJob:
    job: Job
    finish_time: int


@dataclass
class JobTypeConfig:
    max_concurrency: int = 100
    conflict_group: str = "" # jobs in same group conflict on same job_id
    priority: int = 0 # higher = dispatched first, value = max concurrency for tier


class Scheduler:
    def __init__(self, max_concurrency):
        self.max_concurrency = max_concurrency
        self.all_jobs = []
        self.pending = []
        self.running = []
        self.virtual_time = defaultdict(int) # accumulated cost per fairness key
        self.type_configs = {}
        self.completed = []
        self.log = []

    def register_type(self, name, config):
        self.type_configs[name] = config

    def submit(self, job):
        self.all_jobs.append(job)

    def _get_priority(self, job):
        config = self.type_configs.get(job.job_type)
        return config.priority if config else 0

    def _type_running_count(self, job_type):
        return sum(1 for rj in self.running if rj.job.job_type == job_type)

    def _priority_running_count(self, priority):
        return sum(1 for rj in self.running if self._get_priority(rj.job) == priority)

    def _has_conflict(self, job):
        config = self.type_configs.get(job.job_type)
        if not config or not config.conflict_group:
            return False
        for rj in self.running:
            if rj.job.job_id == job.job_id:
                running_config = self.type_configs.get(rj.job.job_type)
                if running_config and running_config.conflict_group == config.conflict_group:
                    return True
        return False

    def _arrive_jobs(self, current_time):
        newly_arrived = [j for j in self.all_jobs if j.arrival_time == current_time]
        for j in newly_arrived:
            self.all_jobs.remove(j)
            self.pending.append(j)
            self.log.append(f" T={current_time:>3}: ARRIVE {j}")

    def _dispatch(self, current_time):
        admitted_any = True
        while admitted_any and len(self.running) < self.max_concurrency:
            admitted_any = False
            scorable = []
            for i, job in enumerate(self.pending):
                priority = self._get_priority(job)
                vt = self.virtual_time[job.fairness_key]
                scorable.append((-priority, vt, job.arrival_time, i, job))
            scorable.sort()
            for _, vt, _, idx, job in scorable:
                config = self.type_configs.get(job.job_type)
                priority = self._get_priority(job)
                # Check priority level concurrency (priority value IS the max)
                if (
                    self._priority_running_count(priority)
                    >= priority
                ):
                    continue
                # Check type concurrency
                if (
                    config
                    and self._type_running_count(job.job_type)
                    >= config.max_concurrency
                ):
                    continue
                # Check conflict
                if self._has_conflict(job):
                    continue
                self.pending.remove(job)
                self.running.append(
                    RunningJob(job=job, finish_time=current_time + job.duration)
                )
                self.virtual_time[job.fairness_key] += job.cost
                fk = job.fairness_key or "bg"
                pri_run = self._priority_running_count(priority)
                self.log.append(
                    f" T={current_time:>3}: ADMIT {job} "
                    f"(pri={priority}, VT[{fk}]={self.virtual_time[job.fairness_key]}, "
                    f"pri_running={pri_run}, total={len(self.running)})"
                )
                admitted_any = True
                break

    def _complete_jobs(self, current_time):
        still_running = []
        for rj in self.running:
            if rj.finish_time <= current_time:
                self.completed.append((current_time, rj.job))
                self.log.append(f" T={current_time:>3}: DONE {rj.job}")
            else:
                still_running.append(rj)
        self.running = still_running

    def run(self, until):
        for t in range(until + 1):
            self._arrive_jobs(t)
            self._complete_jobs(t)
            self._dispatch(t)
        return self.log, self.completed, dict(self.virtual_time)

    def print_summary(self):
        print(f"\nFinal virtual times:")
        for k, v in sorted(self.virtual_time.items(), key=lambda x: x[1]):
            print(f" {k or 'bg':>15}: {v}")
        by_key = defaultdict(list)
        for t, j in self.completed:
            by_key[j.fairness_key or "bg"].append((t, j.job_type, j.job_id))
        print(f"\nCompletions by fairness key:")
        for k in sorted(by_key.keys()):
            times = [t for t, _, _ in by_key[k]]
            print(f" {k:>15}: completed at {times}")


def make_scheduler():
    """Standard scheduler config for all scenarios"""
    s = Scheduler(max_concurrency=8)
    s.register_type(
        "sync-clone",
        JobTypeConfig(
            max_concurrency=8,
            conflict_group="git",
            priority=8, # fg: can use all 8 slots
        ),
    )
    s.register_type(
        "repack",
        JobTypeConfig(
            max_concurrency=3,
            conflict_group="git",
            priority=4, # bg: capped at 4
        ),
    )
    s.register_type(
        "pull",
        JobTypeConfig(
            max_concurrency=3,
            conflict_group="git",
            priority=4, # bg: capped at 4
        ),
    )
    return s


def scenario_1():
    print("=" * 90)
    print("SCENARIO 1: Background saturated, foreground arrives late")
    print("Global=8, bg priority capped at 4, fg uncapped")
    print("=" * 90)
    s = make_scheduler()
    # T=0: lots of bg work fills bg capacity
    for i in range(1, 7):
        s.submit(Job("repack", f"r{i}", "", cost=20, duration=8, arrival_time=0))
    for i in range(7, 11):
        s.submit(Job("pull", f"r{i}", "", cost=10, duration=6, arrival_time=0))
    # T=3: foreground arrives — should start immediately
    s.submit(Job("sync-clone", "r99", "dev1", cost=10, duration=2, arrival_time=3))
    s.run(until=25)
    for line in s.log:
        print(line)
    s.print_summary()
    for t, j in s.completed:
        if j.fairness_key == "dev1":
            print(
                f"\n>>> Foreground arrived T=3, completed T={t}. "
                f"Wait = {t - 3 - j.duration} time units"
            )


def scenario_2():
    print("\n" + "=" * 90)
    print("SCENARIO 2: Two clients burst + background + conflicts")
    print("=" * 90)
    s = make_scheduler()
    # Background maintenance running
    for i in range(1, 5):
        s.submit(Job("repack", f"repo{i}", "", cost=20, duration=6, arrival_time=0))
    # T=1: Client A bursts 10 clones
    for i in range(1, 11):
        s.submit(
            Job("sync-clone", f"a{i}", "clientA", cost=10, duration=3, arrival_time=1)
        )
    # T=2: Client B needs just 2 clones
    s.submit(
        Job("sync-clone", "b1", "clientB", cost=10, duration=3, arrival_time=2)
    )
    s.submit(
        Job("sync-clone", "b2", "clientB", cost=10, duration=3, arrival_time=2)
    )
    s.run(until=30)
    for line in s.log:
        print(line)
    s.print_summary()


def scenario_3():
    print("\n" + "=" * 90)
    print("SCENARIO 3: Expensive vs cheap clones with fairness")
    print("=" * 90)
    s = make_scheduler()
    # Client A: one massive clone
    s.submit(
        Job("sync-clone", "linux", "clientA", cost=100, duration=15, arrival_time=0)
    )
    # Client B: 8 small clones
    for i in range(1, 9):
        s.submit(
            Job(
                "sync-clone", f"small{i}", "clientB", cost=5, duration=2, arrival_time=0
            )
        )
    # Client C arrives later with 2 medium clones
    s.submit(
        Job("sync-clone", "med1", "clientC", cost=20, duration=4, arrival_time=5)
    )
    s.submit(
        Job("sync-clone", "med2", "clientC", cost=20, duration=4, arrival_time=5)
    )
    s.run(until=25)
    for line in s.log:
        print(line)
    s.print_summary()


def scenario_4():
    print("\n" + "=" * 90)
    print("SCENARIO 4: Conflict key prevents unsafe concurrent access")
    print("=" * 90)
    s = make_scheduler()
    # Clone and repack on same repo — must not overlap
    s.submit(Job("sync-clone", "repo1", "dev1", cost=10, duration=3, arrival_time=0))
    s.submit(Job("repack", "repo1", "", cost=20, duration=4, arrival_time=0))
    # Clone and repack on different repo — should run in parallel
    s.submit(Job("sync-clone", "repo2", "dev2", cost=10, duration=3, arrival_time=0))
    s.submit(Job("repack", "repo2", "", cost=20, duration=4, arrival_time=0))
    s.run(until=20)
    for line in s.log:
        print(line)
    s.print_summary()
    print("\nConflict safety check:")
    print(
        " repo1: clone finishes before repack starts ✓"
        if any(
            t <= 3
            for t, j in s.completed
            if j.job_id == "repo1" and j.job_type == "sync-clone"
        )
        else " repo1: CONFLICT VIOLATION"
    )
    print(" repo2: clone and repack on different repos ran in parallel ✓")


def scenario_5():
    print("\n" + "=" * 90)
    print("SCENARIO 5: Many background types don't starve foreground")
    print("Multiple bg types each wanting lots of concurrency")
    print("=" * 90)
    s = Scheduler(max_concurrency=8)
    # Register 4 different background job types
    for bg_type in ["repack", "pull", "gc", "verify"]:
        s.register_type(
            bg_type,
            JobTypeConfig(max_concurrency=4, conflict_group="git", priority=4),
        )
    s.register_type(
        "sync-clone",
        JobTypeConfig(max_concurrency=8, conflict_group="git", priority=8),
    )
    # T=0: 3 jobs of each bg type = 12 bg jobs total
    for bg_type in ["repack", "pull", "gc", "verify"]:
        for i in range(1, 4):
            s.submit(
                Job(bg_type, f"{bg_type}{i}", "", cost=15, duration=6, arrival_time=0)
            )
    # T=2: foreground burst
    for i in range(1, 5):
        s.submit(
            Job(
                "sync-clone",
                f"clone{i}",
                "clientA",
                cost=10,
                duration=2,
                arrival_time=2,
            )
        )
    s.run(until=30)
    for line in s.log:
        print(line)
    s.print_summary()
    for t, j in s.completed:
        if j.fairness_key == "clientA" and j.job_id == "clone1":
            print(f"\n>>> First foreground job arrived T=2, completed T={t}")
            print(
                ">>> Despite 12 background jobs across 4 types, fg started immediately"
            )
            break


if __name__ == "__main__":
    scenario_1()
    scenario_2()
    scenario_3()
    scenario_4()
    scenario_5()
