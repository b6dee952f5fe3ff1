"""The natural-gradient step: its parameterisations and maps, GPflow's step recorded, in closed form, by LAPACK.

Internal: the public names are re-exported by :mod:`natgrad_diag`. This docstring states the maths once; the
modules refer to it. GPflow's ``gpflow/optimizers/natgrad.py`` (2.11) implements equation [10] of Salimbeni,
Eleftheriadis & Hensman, "Natural Gradients in Practice: Non-Conjugate Variational Inference in Gaussian Process
Models", AISTATS 2018. Per latent GP, with m = q_mu [M, L], L_S = q_sqrt [L, M, M] (lower triangular) and
S = L_S L_Sᵀ, the parameterisations of q(u) are

    (m, L_S)                 GPflow's parameters ("meanvarsqrt")
    η = (η₁, η₂)             = (m, S + m mᵀ), the expectation parameters (``meanvarsqrt_to_expectation``)
    θ = (θ₁, θ₂)             = (S⁻¹m, −½S⁻¹), the natural parameters (``meanvarsqrt_to_natural``)
    ξ                        the coordinates of the step: ξ = θ for ``XiNat``, ξ = (m, L_S) for ``XiSqrtMeanVar``

with the map back (m, L_S) = (η₁, chol(η₂ − η₁η₁ᵀ)) (``expectation_to_meanvarsqrt``; its Jacobian is
:mod:`.jacobian`). GPflow's step (``NaturalGradient._natgrad_apply_gradients``) is

    ∂L/∂η = (∂(m, L_S)/∂η)ᵀ · ∂L/∂(m, L_S)       a vector-Jacobian product Jᵀ·v (``output_gradients``)
    ξ_new = ξ − γ · (∂ξ/∂θ) · ∂L/∂η              (∂ξ/∂θ = I for XiNat), then (m, L_S) = ξ_new mapped back

where ∂L/∂(m, L_S) are the loss gradients mapped to the constrained parameters
(:func:`natgrad_diag._gpflow.to_constrained`). Notation of the closed forms: G = ∂L/∂L_S; C = chol(S) = L_S·D
with D = diag(sign L_S,ii) (GPflow does not constrain the signs of q_sqrt's diagonal); Φ(X) is the lower triangle
of X with its diagonal halved; J is the exchange matrix (it reverses rows and columns).
"""
