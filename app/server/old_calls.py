"""The AppState methods that app/ui and app/cli still call, each one line into the room that now holds the work
(state.load_lab, state.sweep_lab, state.profiler). The routes call the rooms themselves; delete each method here
once its last caller does too. Nothing new goes here.
"""
from __future__ import annotations


class OldCalls:
    # app/ui/load_tab.py -> state.load_lab
    def start_burst(self, spec):
        return self.load_lab.start_burst(spec)

    def burst_status(self, burst_id):
        return self.load_lab.burst(burst_id)

    def start_ab(self, spec):
        return self.load_lab.start_ab(spec)

    def ab_status(self, ab_id):
        return self.load_lab.ab(ab_id)

    def start_load(self, spec):
        return self.load_lab.start_load(spec)

    def load_status(self, load_id):
        return self.load_lab.load(load_id)

    def stop_load(self, load_id):
        return self.load_lab.stop_load(load_id)

    def running_load(self):
        return self.load_lab.running_load()

    # app/ui/sweep_tab.py -> state.sweep_lab, state.load_lab
    def start_sweep(self, spec):
        return self.sweep_lab.start(spec)

    def sweep_run(self, sweep_id):
        return self.sweep_lab.run(sweep_id)

    def sweep_status(self, sweep_id):
        return self.sweep_lab.status(sweep_id)

    def stop_sweep(self, sweep_id):
        return self.sweep_lab.stop(sweep_id)

    def running_sweep(self):
        return self.sweep_lab.running()

    def import_report(self, raw, slo=None):
        return self.sweep_lab.import_report(raw, slo)

    def imported_report(self, import_id):
        return self.sweep_lab.imported(import_id)

    def load_test_values(self):
        return self.load_lab.latest_values()

    # app/cli.py -> state.profiler
    def start_profile(self, steps):
        return self.profiler.start(steps)
