-- average_rank(x, part) -> DOUBLE: the rank of x among the rows of its window partition `part` (one column, or a
-- row of several: (a, b)), ties sharing the average of the ranks they span; Spearman's ρ of x and y over a
-- partition is corr(average_rank(x, part), average_rank(y, part)), the one definition css_grid, zoo_stats and
-- definition_agreement use.
CREATE OR REPLACE MACRO average_rank(x, part) AS
    (rank() OVER (PARTITION BY part ORDER BY x) + count(*) OVER (PARTITION BY part) + 1
     - rank() OVER (PARTITION BY part ORDER BY x DESC)) / 2.0;
