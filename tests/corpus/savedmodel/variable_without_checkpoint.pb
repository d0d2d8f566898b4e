à
"serve*2.99.0z
.
xPlaceholder*
dtype0*
shape:
-
v
VariableV2*
dtype0*
shape:

yAddV2xv*
T0*Q
serving_default>

x
x:0
y
y:0tensorflow/serving/predict