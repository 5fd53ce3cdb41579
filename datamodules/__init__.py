"""LightningDataModules, deterministic from a seed; synthetic tasks are generated, never downloaded."""
from datamodules.mnist import MNISTContinual
from datamodules.regression import LinearTask, RankOne, SemanticHierarchy, TaskModes, WhitenedRegression
from datamodules.teacher_student import TeacherStudent

__all__ = ["LinearTask", "MNISTContinual", "RankOne", "SemanticHierarchy", "TaskModes", "TeacherStudent", "WhitenedRegression"]
