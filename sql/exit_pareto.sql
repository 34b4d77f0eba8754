-- exit_pareto(sim_run, sim_device, sim_batch := 1, ...) -> the exit_simulation rows no other policy beats on
-- both accuracy (higher) and mean cost (lower): the accuracy-latency Pareto front of the realisable policies
-- (the oracle needs the label, so it is an upper bound, never a point of the front).
CREATE OR REPLACE MACRO exit_pareto(sim_run, sim_device, sim_batch := 1, ks := [1, 2, 3, 4],
                                    thresholds := NULL,
                                    combined_thresholds := [0.5, 0.7, 0.9], scope := 'auto',
                                    gate_thresholds := NULL) AS TABLE
WITH s AS (SELECT * FROM exit_simulation(sim_run, sim_device, sim_batch := sim_batch, ks := ks,
                                         thresholds := thresholds, combined_thresholds := combined_thresholds,
                                         scope := scope, gate_thresholds := gate_thresholds)
       WHERE policy <> 'oracle')
SELECT a.* FROM s a
WHERE NOT EXISTS (
    SELECT 1 FROM s b
    WHERE b.accuracy >= a.accuracy AND b.mean_ms <= a.mean_ms AND (b.accuracy > a.accuracy OR b.mean_ms < a.mean_ms))
ORDER BY a.mean_ms;
