-- exit_frontier(sim_run, sim_device, sim_batch := 1, ...) -> every exit_simulation row and on_front: whether
-- exit_pareto has it (no realisable policy beats it on both accuracy and mean cost): the simulation and its front
-- from one simulation (the report draws both).
CREATE OR REPLACE MACRO exit_frontier(sim_run, sim_device, sim_batch := 1, ks := [1, 2, 3, 4],
                                      thresholds := NULL,
                                      combined_thresholds := [0.5, 0.7, 0.9], scope := 'auto',
                                      gate_thresholds := NULL) AS TABLE
WITH s AS MATERIALIZED (SELECT * FROM exit_simulation(sim_run, sim_device, sim_batch := sim_batch, ks := ks,
                                                      thresholds := thresholds,
                                                      combined_thresholds := combined_thresholds, scope := scope,
                                                      gate_thresholds := gate_thresholds))
SELECT a.*, a.policy <> 'oracle' AND NOT EXISTS (
    SELECT 1 FROM s b
    WHERE b.policy <> 'oracle' AND b.accuracy >= a.accuracy AND b.mean_ms <= a.mean_ms
      AND (b.accuracy > a.accuracy OR b.mean_ms < a.mean_ms)) AS on_front
FROM s a;
