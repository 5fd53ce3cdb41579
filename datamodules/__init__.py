"""LightningDataModules, deterministic from a seed; synthetic tasks are generated, never downloaded."""
from datamodules.contexts import Contexts
from datamodules.latents import Latents
from datamodules.mnist import MNISTContinual
from datamodules.mnist_images import MNISTImages
from datamodules.shapes import DSprites, Shapes3D
from datamodules.regression import LinearTask, RankOne, SemanticHierarchy, TaskModes, WhitenedRegression
from datamodules.teacher_student import TeacherStudent
from datamodules.xor import XorMargin

__all__ = [
    "Contexts", "DSprites", "Latents", "LinearTask", "MNISTContinual", "MNISTImages", "RankOne", "SemanticHierarchy",
    "Shapes3D", "TaskModes", "TeacherStudent", "WhitenedRegression", "XorMargin",
]
