…
"serve*2.99.0ž
.
xPlaceholder*
dtype0*
shape:
-
v
VariableV2*
dtype0*
shape:

setAssignvx*
T0

yIdentityx^set*
T0*Q
serving_default>

x
x:0
y
y:0tensorflow/serving/predict