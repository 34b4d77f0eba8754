-- exit_pareto(sim_run, sim_device, sim_batch := 1, ...) -> the exit_simulation rows no other policy beats on
-- both accuracy (higher) and mean cost (lower): the accuracy-latency Pareto front of the realisable policies
-- (the oracle needs the label, so it is an upper bound, never a point of the front).
CREATE OR REPLACE MACRO exit_pareto(sim_run, sim_device, sim_batch := 1, ks := [1, 2, 3, 4],
                                    thresholds := [0.5, 0.51, 0.52, 0.53, 0.54, 0.55, 0.56, 0.57, 0.58, 0.59, 0.6,
                                                   0.61, 0.62, 0.63, 0.64, 0.65, 0.66, 0.67, 0.68, 0.69, 0.7, 0.71,
                                                   0.72, 0.73, 0.74, 0.75, 0.76, 0.77, 0.78, 0.79, 0.8, 0.81, 0.82,
                                                   0.83, 0.84, 0.85, 0.86, 0.87, 0.88, 0.89, 0.9, 0.91, 0.92, 0.93,
                                                   0.94, 0.95, 0.96, 0.97, 0.98, 0.99],  -- 0.5:0.99:0.01 (ExitPolicies)
                                    combined_thresholds := [0.5, 0.7, 0.9], scope := 'auto',
                                    gate_thresholds := [0.5, 0.51, 0.52, 0.53, 0.54, 0.55, 0.56, 0.57, 0.58, 0.59, 0.6,
                                                        0.61, 0.62, 0.63, 0.64, 0.65, 0.66, 0.67, 0.68, 0.69, 0.7, 0.71,
                                                        0.72, 0.73, 0.74, 0.75, 0.76, 0.77, 0.78, 0.79, 0.8, 0.81, 0.82,
                                                        0.83, 0.84, 0.85, 0.86, 0.87, 0.88, 0.89, 0.9, 0.91, 0.92, 0.93,
                                                        0.94, 0.95, 0.96, 0.97, 0.98, 0.99]) AS TABLE
WITH s AS (SELECT * FROM exit_simulation(sim_run, sim_device, sim_batch := sim_batch, ks := ks,
                                         thresholds := thresholds, combined_thresholds := combined_thresholds,
                                         scope := scope, gate_thresholds := gate_thresholds)
       WHERE policy <> 'oracle')
SELECT a.* FROM s a
WHERE NOT EXISTS (
    SELECT 1 FROM s b
    WHERE b.accuracy >= a.accuracy AND b.mean_ms <= a.mean_ms AND (b.accuracy > a.accuracy OR b.mean_ms < a.mean_ms))
ORDER BY a.mean_ms;
