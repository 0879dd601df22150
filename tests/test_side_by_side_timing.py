"""The side-by-side timing of the comparison and the benchmarks
(fairseq_widearch.experiments.counting.alternating_rounds): every system runs once a round,
another one goes first each round, and each is charged only its own time."""
from fairseq_widearch.experiments.counting import alternating_rounds


def test_each_run_is_charged_its_own_time_and_who_goes_first_rotates():
    clock, calls = [0.0], []

    def run(name, cost):
        def step():
            calls.append(name)
            clock[0] += cost
        return step

    seconds = alternating_rounds({"a": run("a", 1.0), "b": run("b", 10.0), "c": run("c", 100.0)}, rounds=3,
                                 now=lambda: clock[0])
    assert seconds == {"a": 3.0, "b": 30.0, "c": 300.0}
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
