"""The RL maths and data: the policy loss (`loss`), the advantage estimators
(`advantages`), learning-rate schedules (`lr_schedule`), prompts and tasks (`data`), reward
functions (`rewards`), and the `Batch` passed along the graph's edges."""
