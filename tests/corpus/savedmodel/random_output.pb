
"serve*2.99.0¨
.
xPlaceholder*
dtype0*
shape:
.
sConst*
dtype0*
valueB
8
+
rRandomUniforms*
dtype0*
T0

yAddV2xr*
T0*Q
serving_default>

x
x:0
y
y:0tensorflow/serving/predict