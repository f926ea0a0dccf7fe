"""Student (vertical) models distilled from the GEM teacher, and the Student Adapter.

`data` reads the days after the teacher's training window with one teacher version's exports
(logits, user/ad embeddings); `student` is the small per-surface model; `losses` the label and
distillation objectives; `adapter` the Student Adapter that corrects the stale teacher on the
freshest labels; `variants` trains and evaluates the labels-only / KD / adapter students;
`artefact` writes and loads a student version. `jobs/train_student.py` is the entry point.
"""
